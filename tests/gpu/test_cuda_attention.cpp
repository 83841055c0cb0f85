// CudaDevice causal grouped-query flash attention (attention_fwd.cu, attention_bwd.cu) against
// the CpuDevice reference: forward out and lse, backward dq, dk, dv, for f32 (SIMT kernels,
// ≤ 1e-5) and bf16 (tensor-core kernels for Dh 64 / 128, SIMT fallback otherwise, ≤ 1e-2).
// Shapes cover T = 1, T not a multiple of the 16 / 32 / 64-row tiles, MHA and GQA groups of
// 2 and 4, batch > 1, the head dims of both paths, and the Llama 3.2 1B attention shape.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"

namespace meshtrain::gputest {
namespace {

struct AttnShape {
  int64_t b, t, hq, hkv, dh;
};

std::string describe(const AttnShape& s) {
  return "attention B" + std::to_string(s.b) + " T" + std::to_string(s.t) + " Hq" + std::to_string(s.hq) + " Hkv" +
         std::to_string(s.hkv) + " Dh" + std::to_string(s.dh);
}

std::vector<float> round_to(DType dt, std::vector<float> v) {
  if (dt == DType::kBF16)
    for (auto& x : v) x = float_from_bf16(bf16_from_float(x));
  return v;
}

/// A pair whose GPU tensor is a view `offset` elements into a larger buffer (misaligned for
/// 16-byte vector loads when offset is odd).
Pair offset_pair(const Shape& s, DType dt, const std::vector<float>& v, int64_t offset) {
  Tensor big = gpu().empty({shape_numel(s) + offset}, dt, MemCategory::kTemporaries);
  Pair p{cpu().empty(s, DType::kF32, MemCategory::kTemporaries), big.view(s, offset)};
  set_values(cpu(), p.c, v);
  set_values(gpu(), p.g, v);
  return p;
}

/// Forward and backward of one shape on both devices. The backward gets identical inputs on
/// both: the CPU forward's out (rounded to the dtype, as the GPU stores it) and lse, so it is
/// tested on its own rather than through the forward's rounding. `gpu_offset` > 0 puts every GPU
/// tensor at that element offset into a larger buffer.
void check_attention(const AttnShape& s, DType dt, uint64_t seed, int64_t gpu_offset = 0) {
  const Shape qs{s.b, s.t, s.hq, s.dh}, ks{s.b, s.t, s.hkv, s.dh}, ls{s.b, s.hq, s.t};
  const float scale = 1.0f / std::sqrt(float(s.dh));
  const std::string name = describe(s) + (gpu_offset ? " (offset views)" : "");
  const bool bf = dt == DType::kBF16;
  auto input = [&](const Shape& sh, DType d, std::vector<float> v) {
    return gpu_offset ? offset_pair(sh, d, v, gpu_offset) : make_pair(sh, d, v);
  };
  auto output = [&](const Shape& sh, DType d) {
    if (!gpu_offset) return output_pair(sh, d);
    Pair p = offset_pair(sh, d, std::vector<float>(size_t(shape_numel(sh)), 0.0f), gpu_offset);
    poison(p.g);
    return p;
  };

  const Pair q = input(qs, dt, randn(shape_numel(qs), seed, 1.0f, bf));
  const Pair k = input(ks, dt, randn(shape_numel(ks), seed + 1, 1.0f, bf));
  const Pair v = input(ks, dt, randn(shape_numel(ks), seed + 2, 1.0f, bf));
  const Pair out = output(qs, dt), lse = output(ls, DType::kF32);
  cpu().attention_forward(q.c, k.c, v.c, out.c, lse.c, scale);
  gpu().attention_forward(q.g, k.g, v.g, out.g, lse.g, scale);
  expect_close(out, dt, name + " out");
  expect_close(lse, dt, name + " lse");

  const Pair o_in = input(qs, dt, round_to(dt, host_values(cpu(), out.c)));
  const Pair lse_in = input(ls, DType::kF32, host_values(cpu(), lse.c));
  const Pair dout = input(qs, dt, randn(shape_numel(qs), seed + 3, 1.0f, bf));
  const Pair dq = output(qs, dt), dk = output(ks, dt), dv = output(ks, dt);
  cpu().attention_backward(dout.c, q.c, k.c, v.c, o_in.c, lse_in.c, scale, dq.c, dk.c, dv.c);
  gpu().attention_backward(dout.g, q.g, k.g, v.g, o_in.g, lse_in.g, scale, dq.g, dk.g, dv.g);
  expect_close(dq, dt, name + " dq");
  expect_close(dk, dt, name + " dk");
  expect_close(dv, dt, name + " dv");
}

const AttnShape kShapes[] = {
    {1, 1, 1, 1, 16},     // a single token
    {2, 37, 4, 2, 16},    // partial tiles, GQA group 2, batch 2
    {1, 100, 4, 1, 64},   // GQA group 4 (tensor cores in bf16)
    {2, 130, 2, 2, 64},   // MHA, 3 tiles of 64 with a partial last one
    {1, 130, 4, 2, 128},  // Dh 128 (tensor cores in bf16)
    {2, 64, 2, 1, 128},   // exactly one tile
    {1, 200, 2, 1, 64},   // 4 query tiles per kv tile: the dK/dV pipeline across heads
    {1, 70, 2, 1, 96},    // bf16 SIMT fallback
    {1, 40, 2, 1, 256},   // largest head dim (opt-in shared memory)
    {1, 33, 1, 1, 2},     // smallest head dim
};

BOOST_AUTO_TEST_CASE(attention_f32_matches_cpu) {
  uint64_t seed = 100;
  for (const AttnShape& s : kShapes) check_attention(s, DType::kF32, seed += 10);
}

BOOST_AUTO_TEST_CASE(attention_bf16_matches_cpu) {
  uint64_t seed = 200;
  for (const AttnShape& s : kShapes) check_attention(s, DType::kBF16, seed += 10);
}

// The benchmark model's attention (Llama 3.2 1B: 32 query heads, 8 kv heads, Dh 64) and a
// Qwen3-like Dh 128 GQA shape, on the tensor-core path.
BOOST_AUTO_TEST_CASE(attention_bf16_realistic_shapes) {
  check_attention({1, 1024, 32, 8, 64}, DType::kBF16, 300);
  check_attention({1, 512, 16, 8, 128}, DType::kBF16, 310);
}

BOOST_AUTO_TEST_CASE(attention_f32_llama_shape) { check_attention({1, 1024, 32, 8, 64}, DType::kF32, 320); }

// Views at an odd element offset are not 16-byte aligned: the bf16 call must fall back to the
// SIMT kernels and still be right (and never touch memory outside the views).
BOOST_AUTO_TEST_CASE(attention_misaligned_views) {
  check_attention({1, 100, 4, 2, 64}, DType::kBF16, 400, 1);
  check_attention({2, 37, 4, 2, 16}, DType::kF32, 410, 1);
}

// No atomics anywhere: two backward runs give bitwise identical gradients.
BOOST_AUTO_TEST_CASE(attention_backward_is_deterministic) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const AttnShape s{2, 300, 8, 2, 64};
    const Shape qs{s.b, s.t, s.hq, s.dh}, ks{s.b, s.t, s.hkv, s.dh}, ls{s.b, s.hq, s.t};
    const float scale = 0.125f;
    const Pair q = random_pair(qs, dt, 500), k = random_pair(ks, dt, 501), v = random_pair(ks, dt, 502);
    const Pair dout = random_pair(qs, dt, 503);
    const Pair out = output_pair(qs, dt), lse = output_pair(ls, DType::kF32);
    gpu().attention_forward(q.g, k.g, v.g, out.g, lse.g, scale);
    std::vector<std::vector<float>> runs[2];
    for (auto& r : runs) {
      const Pair dq = output_pair(qs, dt), dk = output_pair(ks, dt), dv = output_pair(ks, dt);
      gpu().attention_backward(dout.g, q.g, k.g, v.g, out.g, lse.g, scale, dq.g, dk.g, dv.g);
      for (const Pair* p : {&dq, &dk, &dv}) r.push_back(host_values(gpu(), p->g));
    }
    for (size_t i = 0; i < 3; ++i)
      BOOST_CHECK_MESSAGE(std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * sizeof(float)) == 0,
                          "attention backward output " << i << " [" << dtype_name(dt) << "] differs between runs");
  }
}

BOOST_AUTO_TEST_CASE(attention_rejects_bad_arguments) {
  auto t = [](const Shape& s, DType d = DType::kF32) { return gpu().empty(s, d, MemCategory::kTemporaries); };
  const float sc = 0.25f;
  // Hq not a multiple of Hkv.
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 4, 16}), t({1, 8, 3, 16}), t({1, 8, 3, 16}), t({1, 8, 4, 16}),
                                            t({1, 4, 8}), sc),
                    std::invalid_argument);
  // Odd and too large head dims.
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 15}), t({1, 8, 1, 15}), t({1, 8, 1, 15}), t({1, 8, 2, 15}),
                                            t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 258}), t({1, 8, 1, 258}), t({1, 8, 1, 258}),
                                            t({1, 8, 2, 258}), t({1, 2, 8}), sc),
                    std::invalid_argument);
  // k / v disagreeing with q, and out / lse of the wrong shape.
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 16}), t({1, 9, 1, 16}), t({1, 9, 1, 16}), t({1, 8, 2, 16}),
                                            t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 16}), t({1, 8, 1, 16}), t({1, 8, 1, 16}), t({1, 8, 2, 16}),
                                            t({1, 8, 2}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 16}), t({1, 8, 1, 16}), t({1, 8, 1, 16}), t({1, 8, 1, 16}),
                                            t({1, 2, 8}), sc),
                    std::invalid_argument);
  // Mixed dtypes, an integer q, a bf16 lse.
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 16}, DType::kBF16), t({1, 8, 1, 16}), t({1, 8, 1, 16}),
                                            t({1, 8, 2, 16}), t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 16}, DType::kI32), t({1, 8, 1, 16}, DType::kI32),
                                            t({1, 8, 1, 16}, DType::kI32), t({1, 8, 2, 16}, DType::kI32),
                                            t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_forward(t({1, 8, 2, 16}), t({1, 8, 1, 16}), t({1, 8, 1, 16}), t({1, 8, 2, 16}),
                                            t({1, 2, 8}, DType::kBF16), sc),
                    std::invalid_argument);
  // Backward: dk shaped like q, and a bf16 dq next to f32 inputs.
  const Tensor q = t({1, 8, 2, 16}), k = t({1, 8, 1, 16}), lse = t({1, 2, 8});
  BOOST_CHECK_THROW(gpu().attention_backward(t({1, 8, 2, 16}), q, k, t({1, 8, 1, 16}), t({1, 8, 2, 16}), lse, sc,
                                             t({1, 8, 2, 16}), t({1, 8, 2, 16}), t({1, 8, 1, 16})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_backward(t({1, 8, 2, 16}), q, k, t({1, 8, 1, 16}), t({1, 8, 2, 16}), lse, sc,
                                             t({1, 8, 2, 16}, DType::kBF16), t({1, 8, 1, 16}), t({1, 8, 1, 16})),
                    std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain::gputest

int main(int argc, char** argv) { return meshtrain::gputest::gpu_test_main(argc, argv); }
