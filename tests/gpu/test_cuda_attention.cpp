// CudaDevice causal grouped-query flash attention (attention_fwd.cu, attention_bwd.cu) against
// the CpuDevice reference: forward out and lse, backward dq, dk, dv, for f32 (SIMT kernels,
// ≤ 1e-5) and bf16 (tensor-core kernels for Dh 64 / 128, SIMT fallback otherwise, ≤ 1e-2).
// Shapes cover T = 1, T not a multiple of the 16 / 32 / 64-row tiles, MHA and GQA groups of
// 2 and 4, batch > 1, the head dims of both paths, and the Llama 3.2 1B attention shape.
//
// The block forms of context parallelism (attention_block_forward, attention_merge,
// attention_block_backward; Liu et al. 2023, Ring Attention) against a direct fp64 host
// computation: single blocks (unmasked with Tq ≠ Tk and Tq = Tk, causal), and whole causal
// sequences assembled ring-style from 2–3 chunks, whose merged output and summed block
// gradients must equal full causal attention (f32 ≤ 1e-4, bf16 ≤ 2e-2 normwise). Document
// masks (DocumentMask): test_cuda_doc_attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
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


// ---------------------------------------------------------------------------------------------
// Block attention (context parallelism) against an fp64 host reference
// ---------------------------------------------------------------------------------------------

/// One block: q [B, Tq, Hq, Dh], k, v [B, Tk, Hkv, Dh].
struct BlockShape {
  int64_t b, tq, tk, hq, hkv, dh;
};

std::string describe(const BlockShape& s, AttentionMask mask) {
  return std::string("attention block ") + (mask == AttentionMask::kCausal ? "causal" : "unmasked") + " B" +
         std::to_string(s.b) + " Tq" + std::to_string(s.tq) + " Tk" + std::to_string(s.tk) + " Hq" +
         std::to_string(s.hq) + " Hkv" + std::to_string(s.hkv) + " Dh" + std::to_string(s.dh);
}

/// Normwise tolerance against fp64: the bf16 tensor-core kernels round P and dS to bf16 before
/// their second product; the f32 kernels only reorder f32 sums.
double block_tol(DType dt) { return dt == DType::kBF16 ? 2e-2 : 1e-4; }

/// fp64 definition of Device::attention_block_forward: out [B, Tq, Hq, Dh] and lse [B, Hq, Tq]
/// of softmax(scale·q·kᵀ) over the keys each query sees (kCausal: s ≤ t); a row without keys
/// gets zeros and −inf.
void ref_block_forward(const BlockShape& s, AttentionMask mask, double scale, const std::vector<float>& q,
                       const std::vector<float>& k, const std::vector<float>& v, std::vector<double>& out,
                       std::vector<double>& lse) {
  out.assign(size_t(s.b * s.tq * s.hq * s.dh), 0.0);
  lse.assign(size_t(s.b * s.hq * s.tq), -INFINITY);
  const int64_t group = s.hq / s.hkv;
  std::vector<double> p(size_t(s.tk));
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t t = 0; t < s.tq; ++t) {
        const int64_t kvh = h / group, n = mask == AttentionMask::kCausal ? t + 1 : s.tk;
        if (n == 0) continue;
        const float* qr = &q[size_t(((b * s.tq + t) * s.hq + h) * s.dh)];
        double m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* kr = &k[size_t(((b * s.tk + j) * s.hkv + kvh) * s.dh)];
          double acc = 0;
          for (int64_t d = 0; d < s.dh; ++d) acc += double(qr[d]) * kr[d];
          p[size_t(j)] = acc * scale;
          m = std::max(m, p[size_t(j)]);
        }
        double l = 0;
        for (int64_t j = 0; j < n; ++j) l += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
        double* o = &out[size_t(((b * s.tq + t) * s.hq + h) * s.dh)];
        for (int64_t j = 0; j < n; ++j) {
          const float* vr = &v[size_t(((b * s.tk + j) * s.hkv + kvh) * s.dh)];
          for (int64_t d = 0; d < s.dh; ++d) o[d] += p[size_t(j)] / l * vr[d];
        }
        lse[size_t((b * s.hq + h) * s.tq + t)] = m + std::log(l);
      }
}

/// fp64 definition of Device::attention_block_backward (FlashAttention-2, Dao 2023, Algorithm
/// 2, with an external lse): P = exp(scale·q·kᵀ − lse), D = rowsum(dout ∘ out),
/// dS = P ∘ (dout·vᵀ − D); adds scale·dS·k to dq, scale·dSᵀ·q to dk and Pᵀ·dout to dv.
void ref_block_backward(const BlockShape& s, AttentionMask mask, double scale, const std::vector<float>& dout,
                        const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                        const std::vector<double>& out, const std::vector<double>& lse, std::vector<double>& dq,
                        std::vector<double>& dk, std::vector<double>& dv) {
  const int64_t group = s.hq / s.hkv;
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t t = 0; t < s.tq; ++t) {
        const int64_t kvh = h / group, n = mask == AttentionMask::kCausal ? t + 1 : s.tk;
        const size_t qo = size_t(((b * s.tq + t) * s.hq + h) * s.dh);
        const double l = lse[size_t((b * s.hq + h) * s.tq + t)];
        double dd = 0;
        for (int64_t d = 0; d < s.dh; ++d) dd += double(dout[qo + size_t(d)]) * out[qo + size_t(d)];
        for (int64_t j = 0; j < n; ++j) {
          const size_t ko = size_t(((b * s.tk + j) * s.hkv + kvh) * s.dh);
          double sc = 0, dp = 0;
          for (int64_t d = 0; d < s.dh; ++d) {
            sc += double(q[qo + size_t(d)]) * k[ko + size_t(d)];
            dp += double(dout[qo + size_t(d)]) * v[ko + size_t(d)];
          }
          const double p = std::exp(sc * scale - l), ds = p * (dp - dd);
          for (int64_t d = 0; d < s.dh; ++d) {
            dq[qo + size_t(d)] += scale * ds * k[ko + size_t(d)];
            dk[ko + size_t(d)] += scale * ds * q[qo + size_t(d)];
            dv[ko + size_t(d)] += p * dout[qo + size_t(d)];
          }
        }
      }
}

/// Checks got against the fp64 reference: max|got − ref| / max|ref| ≤ tol; `base` (when not
/// empty) is subtracted from got first, for outputs that were accumulated into. A non-finite
/// element fails.
void expect_near_ref(const std::vector<float>& got, const std::vector<double>& ref, double tol,
                     const std::string& what, const std::vector<float>& base = {}) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.size());
  double num = 0, den = 0;
  bool finite = true;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = double(got[i]) - (base.empty() ? 0.0 : double(base[i]));
    finite = finite && std::isfinite(g);
    num = std::max(num, std::fabs(g - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  const double e = !finite ? INFINITY : den > 0 ? num / den : num;
  BOOST_TEST_MESSAGE(what << ": rel err " << e);
  BOOST_CHECK_MESSAGE(e <= tol, what << ": rel err " << e << " > " << tol);
}

/// A GPU tensor of shape s and dtype dt holding v (rounded to bf16 for bf16), as a view
/// `offset` elements into a larger buffer when offset > 0 (not 16-byte aligned when odd).
Tensor gpu_values(const Shape& s, DType dt, const std::vector<float>& v, int64_t offset = 0) {
  Tensor t = gpu().empty({shape_numel(s) + offset}, dt, MemCategory::kTemporaries).view(s, offset);
  set_values(gpu(), t, v);
  return t;
}
/// An f32 GPU output filled with NaN, so unwritten elements show.
Tensor gpu_poisoned(const Shape& s, int64_t offset = 0) {
  Tensor t = gpu().empty({shape_numel(s) + offset}, DType::kF32, MemCategory::kTemporaries).view(s, offset);
  poison(t);
  return t;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

/// Block forward, then block backward with an external out and lse, against the fp64
/// reference. The backward sees lse = the block's own lse + u, u ∈ [0, 2) (other blocks' share
/// of the softmax mass, so P ≤ 1 as in a real merge), an arbitrary out, and gradients that
/// start from random values (they must be added to).
void check_block(const BlockShape& s, AttentionMask mask, DType dt, uint64_t seed, int64_t offset = 0) {
  const Shape qs{s.b, s.tq, s.hq, s.dh}, ks{s.b, s.tk, s.hkv, s.dh}, ls{s.b, s.hq, s.tq};
  const float scale = 1.0f / std::sqrt(float(s.dh));
  const bool bf = dt == DType::kBF16;
  const double tl = block_tol(dt);
  const std::string name = describe(s, mask) + " [" + dtype_name(dt) + "]" + (offset ? " (offset views)" : "");

  const std::vector<float> q = randn(shape_numel(qs), seed, 1.0f, bf), k = randn(shape_numel(ks), seed + 1, 1.0f, bf),
                           v = randn(shape_numel(ks), seed + 2, 1.0f, bf);
  const Tensor qg = gpu_values(qs, dt, q, offset), kg = gpu_values(ks, dt, k, offset),
               vg = gpu_values(ks, dt, v, offset);
  const Tensor out = gpu_poisoned(qs, offset), lse = gpu_poisoned(ls, offset);
  gpu().attention_block_forward(qg, kg, vg, mask, out, lse, scale);
  std::vector<double> ref_out, ref_lse;
  ref_block_forward(s, mask, scale, q, k, v, ref_out, ref_lse);
  expect_near_ref(host_values(gpu(), out), ref_out, tl, name + " out");
  expect_near_ref(host_values(gpu(), lse), ref_lse, tl, name + " lse");

  std::mt19937_64 gen(seed + 3);
  std::uniform_real_distribution<double> extra(0.0, 2.0);
  std::vector<float> lse_ext(ref_lse.size());
  for (size_t i = 0; i < lse_ext.size(); ++i) lse_ext[i] = float(ref_lse[i] + extra(gen));
  const std::vector<float> out_ext = randn(shape_numel(qs), seed + 4, 0.5f, bf),
                           dout = randn(shape_numel(qs), seed + 5, 1.0f, bf),
                           dq0 = randn(shape_numel(qs), seed + 6, 0.5f), dk0 = randn(shape_numel(ks), seed + 7, 0.5f),
                           dv0 = randn(shape_numel(ks), seed + 8, 0.5f);
  const Tensor dq = gpu_values(qs, DType::kF32, dq0, offset), dk = gpu_values(ks, DType::kF32, dk0, offset),
               dv = gpu_values(ks, DType::kF32, dv0, offset);
  const Tensor dout_g = gpu_values(qs, dt, dout, offset), out_g = gpu_values(qs, dt, out_ext, offset),
               lse_g = gpu_values(ls, DType::kF32, lse_ext, offset);
  gpu().attention_block_backward(dout_g, qg, kg, vg, mask, out_g, lse_g, scale, dq, dk, dv);
  std::vector<double> rdq(q.size(), 0.0), rdk(k.size(), 0.0), rdv(v.size(), 0.0);
  ref_block_backward(s, mask, scale, dout, q, k, v, to_double(out_ext), to_double(lse_ext), rdq, rdk, rdv);
  expect_near_ref(host_values(gpu(), dq), rdq, tl, name + " dq (added)", dq0);
  expect_near_ref(host_values(gpu(), dk), rdk, tl, name + " dk (added)", dk0);
  expect_near_ref(host_values(gpu(), dv), rdv, tl, name + " dv (added)", dv0);
}

struct BlockCase {
  BlockShape s;
  AttentionMask mask;
};
const BlockCase kBlockCases[] = {
    {{1, 100, 130, 4, 1, 64}, AttentionMask::kNone},   // Tq < Tk, GQA 4, partial tiles (tensor cores in bf16)
    {{2, 70, 45, 4, 2, 128}, AttentionMask::kNone},    // Tq > Tk, GQA 2, batch 2, Dh 128
    {{1, 128, 128, 2, 2, 64}, AttentionMask::kNone},   // Tq == Tk, whole tiles
    {{1, 33, 200, 2, 1, 48}, AttentionMask::kNone},    // Dh 48 (SIMT in both dtypes), many key tiles
    {{1, 1, 5, 1, 1, 16}, AttentionMask::kNone},       // a single query
    {{1, 150, 1, 4, 2, 64}, AttentionMask::kNone},     // a single key
    {{2, 37, 37, 4, 2, 48}, AttentionMask::kCausal},   // the diagonal block, Dh 48
    {{1, 130, 130, 4, 2, 128}, AttentionMask::kCausal},
    {{1, 100, 100, 8, 2, 64}, AttentionMask::kCausal},  // GQA 4
};

BOOST_AUTO_TEST_CASE(attention_block_f32_matches_fp64) {
  uint64_t seed = 600;
  for (const BlockCase& c : kBlockCases) check_block(c.s, c.mask, DType::kF32, seed += 10);
}

BOOST_AUTO_TEST_CASE(attention_block_bf16_matches_fp64) {
  uint64_t seed = 700;
  for (const BlockCase& c : kBlockCases) check_block(c.s, c.mask, DType::kBF16, seed += 10);
}

// Odd element offsets: bf16 with Dh 64 falls back to the SIMT kernels with an f32 output.
BOOST_AUTO_TEST_CASE(attention_block_misaligned_views) {
  check_block({1, 100, 70, 4, 2, 64}, AttentionMask::kNone, DType::kBF16, 800, 1);
  check_block({1, 70, 70, 4, 2, 64}, AttentionMask::kCausal, DType::kBF16, 810, 1);
  check_block({2, 37, 20, 4, 2, 16}, AttentionMask::kNone, DType::kF32, 820, 1);
}

/// Rows [t0, t0 + n) of x [B, T, W] (W = H·Dh) as [B, n, W].
std::vector<float> take_rows(const std::vector<float>& x, int64_t b, int64_t t, int64_t w, int64_t t0, int64_t n) {
  std::vector<float> r(size_t(b * n * w));
  for (int64_t i = 0; i < b; ++i)
    std::copy_n(x.begin() + (i * t + t0) * w, n * w, r.begin() + i * n * w);
  return r;
}
/// Writes part [B, n, W] into rows [t0, t0 + n) of x [B, T, W].
void put_rows(std::vector<float>& x, const std::vector<float>& part, int64_t b, int64_t t, int64_t w, int64_t t0,
              int64_t n) {
  for (int64_t i = 0; i < b; ++i) std::copy_n(part.begin() + i * n * w, n * w, x.begin() + (i * t + t0) * w);
}

/// Causal attention over T = Σ chunks computed ring-style, chunk by chunk (Liu et al. 2023,
/// Ring Attention): query chunk i starts from (out, lse) = (0, −inf) and merges the block
/// forwards of key chunks i (kCausal), i − 1, …, 0 (kNone); its backward adds the block
/// backwards of the same pairs, given the merged out (in the activation dtype) and lse, into
/// f32 dq_i, dk_j, dv_j. Out, lse and the summed gradients must equal the fp64 full attention.
void check_ring(int64_t b, const std::vector<int64_t>& chunks, int64_t hq, int64_t hkv, int64_t dh, DType dt,
                uint64_t seed) {
  int64_t t = 0;
  for (int64_t n : chunks) t += n;
  const BlockShape full{b, t, t, hq, hkv, dh};
  const float scale = 1.0f / std::sqrt(float(dh));
  const bool bf = dt == DType::kBF16;
  const double tl = block_tol(dt);
  std::string name = "ring attention B" + std::to_string(b) + " T";
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i) name += '+';
    name += std::to_string(chunks[i]);
  }
  name += " Hq" + std::to_string(hq) + " Hkv" + std::to_string(hkv) + " Dh" + std::to_string(dh) + " [" +
          dtype_name(dt) + "]";

  const int64_t wq = hq * dh, wk = hkv * dh;
  const std::vector<float> q = randn(b * t * wq, seed, 1.0f, bf), k = randn(b * t * wk, seed + 1, 1.0f, bf),
                           v = randn(b * t * wk, seed + 2, 1.0f, bf), dout = randn(b * t * wq, seed + 3, 1.0f, bf);
  const size_t nc = chunks.size();
  std::vector<int64_t> start(nc, 0);
  for (size_t i = 1; i < nc; ++i) start[i] = start[i - 1] + chunks[i - 1];
  std::vector<Tensor> qc, kc, vc, doc;
  for (size_t i = 0; i < nc; ++i) {
    const int64_t n = chunks[i];
    qc.push_back(gpu_values({b, n, hq, dh}, dt, take_rows(q, b, t, wq, start[i], n)));
    kc.push_back(gpu_values({b, n, hkv, dh}, dt, take_rows(k, b, t, wk, start[i], n)));
    vc.push_back(gpu_values({b, n, hkv, dh}, dt, take_rows(v, b, t, wk, start[i], n)));
    doc.push_back(gpu_values({b, n, hq, dh}, dt, take_rows(dout, b, t, wq, start[i], n)));
  }

  // Forward: merge the blocks of each query chunk, the diagonal first as a ring step sees them.
  std::vector<Tensor> outc, lsec;
  std::vector<float> out(size_t(b * t * wq)), lse(size_t(b * hq * t));
  for (size_t i = 0; i < nc; ++i) {
    const int64_t n = chunks[i];
    const Shape os{b, n, hq, dh}, ls{b, hq, n};
    outc.push_back(gpu_values(os, DType::kF32, std::vector<float>(size_t(shape_numel(os)), 0.0f)));
    lsec.push_back(gpu_values(ls, DType::kF32, std::vector<float>(size_t(shape_numel(ls)), -INFINITY)));
    for (size_t j = i + 1; j-- > 0;) {
      const Tensor bo = gpu_poisoned(os), bl = gpu_poisoned(ls);
      gpu().attention_block_forward(qc[i], kc[j], vc[j], j == i ? AttentionMask::kCausal : AttentionMask::kNone, bo,
                                    bl, scale);
      gpu().attention_merge(outc[i], lsec[i], bo, bl);
    }
    put_rows(out, host_values(gpu(), outc[i]), b, t, wq, start[i], n);
    // lse [B, Hq, n] holds rows of n per (b, h): the same row copy with B·Hq "batches".
    put_rows(lse, host_values(gpu(), lsec[i]), b * hq, t, 1, start[i], n);
  }
  std::vector<double> ref_out, ref_lse;
  ref_block_forward(full, AttentionMask::kCausal, scale, q, k, v, ref_out, ref_lse);
  expect_near_ref(out, ref_out, tl, name + " merged out");
  expect_near_ref(lse, ref_lse, tl, name + " merged lse");

  // Backward: every (query chunk i, key chunk j ≤ i) block adds into dq_i, dk_j, dv_j.
  std::vector<Tensor> dqc, dkc, dvc;
  for (size_t i = 0; i < nc; ++i) {
    const int64_t n = chunks[i];
    dqc.push_back(gpu_values({b, n, hq, dh}, DType::kF32, std::vector<float>(size_t(b * n * wq), 0.0f)));
    dkc.push_back(gpu_values({b, n, hkv, dh}, DType::kF32, std::vector<float>(size_t(b * n * wk), 0.0f)));
    dvc.push_back(gpu_values({b, n, hkv, dh}, DType::kF32, std::vector<float>(size_t(b * n * wk), 0.0f)));
  }
  for (size_t i = 0; i < nc; ++i) {
    const Tensor out_act = gpu_values({b, chunks[i], hq, dh}, dt, host_values(gpu(), outc[i]));
    for (size_t j = 0; j <= i; ++j)
      gpu().attention_block_backward(doc[i], qc[i], kc[j], vc[j],
                                     j == i ? AttentionMask::kCausal : AttentionMask::kNone, out_act, lsec[i], scale,
                                     dqc[i], dkc[j], dvc[j]);
  }
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  for (size_t i = 0; i < nc; ++i) {
    put_rows(dq, host_values(gpu(), dqc[i]), b, t, wq, start[i], chunks[i]);
    put_rows(dk, host_values(gpu(), dkc[i]), b, t, wk, start[i], chunks[i]);
    put_rows(dv, host_values(gpu(), dvc[i]), b, t, wk, start[i], chunks[i]);
  }
  std::vector<double> rdq(q.size(), 0.0), rdk(k.size(), 0.0), rdv(v.size(), 0.0);
  ref_block_backward(full, AttentionMask::kCausal, scale, dout, q, k, v, ref_out, ref_lse, rdq, rdk, rdv);
  expect_near_ref(dq, rdq, tl, name + " summed dq");
  expect_near_ref(dk, rdk, tl, name + " summed dk");
  expect_near_ref(dv, rdv, tl, name + " summed dv");
}

BOOST_AUTO_TEST_CASE(ring_attention_f32_matches_full_causal) {
  check_ring(1, {40, 57}, 4, 2, 48, DType::kF32, 900);
  check_ring(2, {64, 64, 64}, 4, 2, 64, DType::kF32, 910);
  check_ring(1, {50, 70, 45}, 4, 1, 128, DType::kF32, 920);
}

BOOST_AUTO_TEST_CASE(ring_attention_bf16_matches_full_causal) {
  check_ring(1, {64, 64, 64}, 4, 2, 64, DType::kBF16, 1000);    // tensor cores, whole tiles
  check_ring(2, {50, 70, 45}, 4, 1, 128, DType::kBF16, 1010);   // uneven chunks, GQA 4, Dh 128
  check_ring(1, {40, 57, 33}, 2, 1, 48, DType::kBF16, 1020);    // SIMT fallback
  check_ring(1, {256, 256}, 32, 8, 64, DType::kBF16, 1030);     // the Llama 3.2 1B attention shape
}

// The merge rule's special rows: nothing seen yet (lse −inf) takes the block; a block that saw
// nothing (lse_b −inf) changes nothing, also when lse is −inf too (as on CpuDevice); far-apart
// lse values (weights e^±100, where the naive σ would overflow) and equal ones; plus random
// rows. Dh 40 is not a multiple of the warp.
BOOST_AUTO_TEST_CASE(attention_merge_special_rows) {
  const int64_t b = 1, t = 8, h = 2, dh = 40, rows = b * t * h;
  const Shape os{b, t, h, dh}, ls{b, h, t};
  const std::vector<float> out = randn(rows * dh, 1100), out_b = randn(rows * dh, 1101);
  std::vector<float> lse = randn(rows, 1102, 3.0f), lse_b = randn(rows, 1103, 3.0f);
  const float ninf = -INFINITY;
  const std::pair<float, float> special[] = {{ninf, 1.5f}, {0.3f, ninf}, {ninf, ninf}, {2.0f, 2.0f},
                                             {50.0f, -60.0f}, {-80.0f, 30.0f}, {-1e30f, 1e30f}};
  for (size_t i = 0; i < std::size(special); ++i) std::tie(lse[i], lse_b[i]) = special[i];

  std::vector<double> ref_out(out.begin(), out.end()), ref_lse(lse.begin(), lse.end());
  for (int64_t r = 0; r < rows; ++r) {  // r = t·H + hh (B = 1) ↔ lse index hh·T + t
    const int64_t hh = r % h, tt = r / h, li = hh * t + tt;
    const double a = lse[size_t(li)], c = lse_b[size_t(li)];
    if (c == -INFINITY) continue;
    if (a == -INFINITY) {
      for (int64_t d = 0; d < dh; ++d) ref_out[size_t(r * dh + d)] = out_b[size_t(r * dh + d)];
      ref_lse[size_t(li)] = c;
    } else {
      const double w = 1.0 / (1.0 + std::exp(a - c));
      for (int64_t d = 0; d < dh; ++d) {
        const size_t i = size_t(r * dh + d);
        ref_out[i] = out[i] - w * (double(out[i]) - out_b[i]);
      }
      ref_lse[size_t(li)] = std::max(a, c) + std::log1p(std::exp(-std::fabs(a - c)));
    }
  }

  const Tensor og = gpu_values(os, DType::kF32, out), lg = gpu_values(ls, DType::kF32, lse);
  gpu().attention_merge(og, lg, gpu_values(os, DType::kF32, out_b), gpu_values(ls, DType::kF32, lse_b));
  expect_near_ref(host_values(gpu(), og), ref_out, 1e-6, "attention_merge out");
  const std::vector<float> got = host_values(gpu(), lg);
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = ref_lse[i];
    const bool ok = r == -INFINITY ? got[i] == -INFINITY : std::fabs(got[i] - r) <= 1e-6 * std::max(1.0, std::fabs(r));
    BOOST_CHECK_MESSAGE(ok, "attention_merge lse[" << i << "] = " << got[i] << ", expected " << r);
  }
}

// A key block with no keys: the empty softmax (out 0, lse −inf, which a merge ignores), and a
// backward that adds nothing.
BOOST_AUTO_TEST_CASE(attention_block_without_keys) {
  const Shape qs{1, 5, 2, 16}, ks{1, 0, 1, 16}, ls{1, 2, 5};
  const Tensor q = gpu_values(qs, DType::kBF16, randn(shape_numel(qs), 1200));
  const Tensor k = gpu().empty(ks, DType::kBF16, MemCategory::kTemporaries);
  const Tensor out = gpu_poisoned(qs), lse = gpu_poisoned(ls);
  gpu().attention_block_forward(q, k, k, AttentionMask::kNone, out, lse, 0.25f);
  for (float x : host_values(gpu(), out)) BOOST_CHECK_EQUAL(x, 0.0f);
  for (float x : host_values(gpu(), lse)) BOOST_CHECK_EQUAL(x, -INFINITY);
  const std::vector<float> dq0 = randn(shape_numel(qs), 1201);
  const Tensor dq = gpu_values(qs, DType::kF32, dq0), dk = gpu().empty(ks, DType::kF32, MemCategory::kTemporaries);
  gpu().attention_block_backward(gpu_values(qs, DType::kBF16, dq0), q, k, k, AttentionMask::kNone,
                                 gpu_values(qs, DType::kBF16, dq0), gpu_values(ls, DType::kF32, randn(10, 1202)),
                                 0.25f, dq, dk, dk);
  BOOST_CHECK(host_values(gpu(), dq) == dq0);
}

// Every gradient element has one writer in a fixed order: two accumulations from zero agree
// bitwise.
BOOST_AUTO_TEST_CASE(attention_block_backward_is_deterministic) {
  for (DType dt : {DType::kBF16, DType::kF32})
    for (AttentionMask mask : {AttentionMask::kNone, AttentionMask::kCausal}) {
      const BlockShape s{2, 200, 200, 8, 2, 64};
      const Shape qs{s.b, s.tq, s.hq, s.dh}, ks{s.b, s.tk, s.hkv, s.dh}, ls{s.b, s.hq, s.tq};
      const Tensor q = gpu_values(qs, dt, randn(shape_numel(qs), 1300)),
                   k = gpu_values(ks, dt, randn(shape_numel(ks), 1301)),
                   v = gpu_values(ks, dt, randn(shape_numel(ks), 1302)),
                   dout = gpu_values(qs, dt, randn(shape_numel(qs), 1303));
      const Tensor out = gpu_poisoned(qs), lse = gpu_poisoned(ls);
      gpu().attention_block_forward(q, k, v, mask, out, lse, 0.125f);
      const Tensor out_act = gpu_values(qs, dt, host_values(gpu(), out));
      std::vector<std::vector<float>> runs[2];
      for (auto& r : runs) {
        const Tensor dq = gpu().zeros(qs, DType::kF32, MemCategory::kTemporaries),
                     dk = gpu().zeros(ks, DType::kF32, MemCategory::kTemporaries),
                     dv = gpu().zeros(ks, DType::kF32, MemCategory::kTemporaries);
        gpu().attention_block_backward(dout, q, k, v, mask, out_act, lse, 0.125f, dq, dk, dv);
        for (const Tensor* g : {&dq, &dk, &dv}) r.push_back(host_values(gpu(), *g));
      }
      for (size_t i = 0; i < 3; ++i)
        BOOST_CHECK_MESSAGE(std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * sizeof(float)) == 0,
                            "attention_block_backward output " << i << " [" << dtype_name(dt) << "]"
                                                               << " differs between runs");
    }
}

BOOST_AUTO_TEST_CASE(attention_block_rejects_bad_arguments) {
  auto t = [](const Shape& s, DType d = DType::kF32) { return gpu().empty(s, d, MemCategory::kTemporaries); };
  const float sc = 0.25f;
  const AttentionMask none = AttentionMask::kNone, causal = AttentionMask::kCausal;
  // kCausal needs Tq == Tk; kNone accepts it.
  BOOST_CHECK_THROW(gpu().attention_block_forward(t({1, 8, 2, 16}), t({1, 6, 1, 16}), t({1, 6, 1, 16}), causal,
                                                  t({1, 8, 2, 16}), t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_NO_THROW(gpu().attention_block_forward(t({1, 8, 2, 16}), t({1, 6, 1, 16}), t({1, 6, 1, 16}), none,
                                                     t({1, 8, 2, 16}), t({1, 2, 8}), sc));
  // k and v disagreeing, Dh mismatch, Hq not a multiple of Hkv.
  BOOST_CHECK_THROW(gpu().attention_block_forward(t({1, 8, 2, 16}), t({1, 6, 1, 16}), t({1, 7, 1, 16}), none,
                                                  t({1, 8, 2, 16}), t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_forward(t({1, 8, 2, 16}), t({1, 6, 1, 32}), t({1, 6, 1, 32}), none,
                                                  t({1, 8, 2, 16}), t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_forward(t({1, 8, 3, 16}), t({1, 6, 2, 16}), t({1, 6, 2, 16}), none,
                                                  t({1, 8, 3, 16}), t({1, 3, 8}), sc),
                    std::invalid_argument);
  // out must be f32 (even for bf16 q), lse f32 [B, Hq, Tq], k the dtype of q.
  const DType bf = DType::kBF16;
  BOOST_CHECK_THROW(gpu().attention_block_forward(t({1, 8, 2, 16}, bf), t({1, 6, 1, 16}, bf), t({1, 6, 1, 16}, bf),
                                                  none, t({1, 8, 2, 16}, bf), t({1, 2, 8}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_forward(t({1, 8, 2, 16}), t({1, 6, 1, 16}), t({1, 6, 1, 16}), none,
                                                  t({1, 8, 2, 16}), t({1, 2, 6}), sc),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_forward(t({1, 8, 2, 16}, bf), t({1, 6, 1, 16}), t({1, 6, 1, 16}), none,
                                                  t({1, 8, 2, 16}), t({1, 2, 8}), sc),
                    std::invalid_argument);
  // Backward: causal with Tq != Tk, bf16 gradients, dk shaped like q, a bf16 lse.
  const Tensor q = t({1, 8, 2, 16}, bf), k = t({1, 6, 1, 16}, bf), lse = t({1, 2, 8});
  BOOST_CHECK_THROW(gpu().attention_block_backward(t({1, 8, 2, 16}, bf), q, k, k, causal, t({1, 8, 2, 16}, bf), lse,
                                                   sc, t({1, 8, 2, 16}), t({1, 6, 1, 16}), t({1, 6, 1, 16})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_backward(t({1, 8, 2, 16}, bf), q, k, k, none, t({1, 8, 2, 16}, bf), lse, sc,
                                                   t({1, 8, 2, 16}, bf), t({1, 6, 1, 16}), t({1, 6, 1, 16})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_backward(t({1, 8, 2, 16}, bf), q, k, k, none, t({1, 8, 2, 16}, bf), lse, sc,
                                                   t({1, 8, 2, 16}), t({1, 8, 2, 16}), t({1, 6, 1, 16})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_backward(t({1, 8, 2, 16}, bf), q, k, k, none, t({1, 8, 2, 16}, bf),
                                                   t({1, 2, 8}, bf), sc, t({1, 8, 2, 16}), t({1, 6, 1, 16}),
                                                   t({1, 6, 1, 16})),
                    std::invalid_argument);
  // Merge: shapes that disagree, a bf16 operand, a non-4-D out.
  BOOST_CHECK_THROW(gpu().attention_merge(t({1, 8, 2, 16}), t({1, 2, 8}), t({1, 8, 2, 8}), t({1, 2, 8})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_merge(t({1, 8, 2, 16}), t({1, 8, 2}), t({1, 8, 2, 16}), t({1, 8, 2})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_merge(t({1, 8, 2, 16}), t({1, 2, 8}), t({1, 8, 2, 16}, bf), t({1, 2, 8})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_merge(t({8, 2, 16}), t({2, 8}), t({8, 2, 16}), t({2, 8})), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain::gputest

int main(int argc, char** argv) { return meshtrain::gputest::gpu_test_main(argc, argv); }
