// Float8 training on the GPU (device/cuda/float8.cu) against the CPU emulation (tensor/float8.hpp,
// itself bit-exact against NumPy):
//   - the casts (float8_amax, float8_cast, float8_cast_with_amax) bit for bit, f32 and bf16,
//     e4m3 and e5m2, each scaling and power-of-two rule, on inputs with NaN / ±inf rows (the
//     group turns NaN), values below the formats' normal range (subnormal codes) and an amax
//     smaller than the data (saturation);
//   - float8_matmul with emulate = false (cuBLASLt FP8 GEMMs) for each TorchAO recipe and each
//     GEMM of a linear layer (forward, grad-input with and without accumulation, grad-weight into
//     f32) against the CPU's emulated GEMM, to bf16 tolerance: both sum the same exact products
//     of 8-bit values (up to the dequantization's rounding), in other orders;
//   - with emulate = true the GPU runs the emulation: f32 to 1e-5.
// Exits 77 (SKIPPED) without a GPU.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "device/cuda/cuda_device.hpp"
#include "gpu_test_util.hpp"
#include "tensor/float8.hpp"

using namespace meshtrain;
using namespace meshtrain::gputest;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Values for a [rows, cols] cast test: N(0, 1) with row 1 holding a NaN, row 2 an inf, row 3
// spanning 2^-30 … 2^5 (codes far below the normal range once scaled), column 4 a −inf in row 5.
std::vector<float> cast_inputs(int64_t rows, int64_t cols, uint64_t seed, bool bf16) {
  std::vector<float> v = randn(rows * cols, seed, 1.0f, bf16);
  v[size_t(1 * cols + 3)] = kNaN;
  v[size_t(2 * cols + 7)] = kInf;
  for (int64_t c = 0; c < cols; ++c) v[size_t(3 * cols + c)] = std::ldexp(c % 2 ? -1.0f : 1.0f, int(c % 36) - 30);
  v[size_t(5 * cols + 4)] = -kInf;
  return v;
}

// Both NaN, or the same bits (−0 and +0 differ).
bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}
float to_dtype(float x, DType dt) { return dt == DType::kBF16 ? float_from_bf16(bf16_from_float(x)) : x; }

// The number of elements where gpu differs from the CPU's values rounded to dt.
int64_t mismatches(const std::vector<float>& gpu_v, const std::vector<float>& cpu_v, DType dt) {
  int64_t n = 0;
  for (size_t i = 0; i < cpu_v.size(); ++i)
    if (!same(gpu_v[i], to_dtype(cpu_v[i], dt))) ++n;
  return n;
}

const char* scaling_name(Float8Scaling s) {
  return s == Float8Scaling::kTensorwise ? "tensorwise" : s == Float8Scaling::kRowwise ? "rowwise" : "columnwise";
}

}  // namespace

BOOST_AUTO_TEST_CASE(casts_are_bit_exact_against_the_cpu) {
  const int64_t rows = 67, cols = 300;  // not multiples of the tile or block sizes
  for (DType dt : {DType::kF32, DType::kBF16})
    for (Float8Format f : {Float8Format::kE4M3, Float8Format::kE5M2})
      for (Float8Scaling s : {Float8Scaling::kTensorwise, Float8Scaling::kRowwise, Float8Scaling::kColumnwise})
        for (bool pow2 : {false, true}) {
          const std::string what = std::string(dtype_name(dt)) + (f == Float8Format::kE4M3 ? " e4m3 " : " e5m2 ") +
                                   scaling_name(s) + (pow2 ? " pow2" : "");
          const Pair x = make_pair({rows, cols}, dt, cast_inputs(rows, cols, 7, dt == DType::kBF16));
          const Float8Cast cast{true, f, s};
          // Amax per group: exact, +inf for the groups holding NaN / inf.
          const int64_t groups = float8_group_count(rows, cols, s);
          Pair amax = output_pair({groups}, DType::kF32);
          cpu().float8_amax(x.c, s, amax.c);
          gpu().float8_amax(x.g, s, amax.g);
          BOOST_TEST(mismatches(host_values(gpu(), amax.g), host_values(cpu(), amax.c), DType::kF32) == 0, what);
          // The whole cast (local amax).
          Pair out = output_pair({rows, cols}, dt);
          cpu().float8_cast(x.c, cast, pow2, out.c);
          gpu().float8_cast(x.g, cast, pow2, out.g);
          BOOST_TEST(mismatches(host_values(gpu(), out.g), host_values(cpu(), out.c), dt) == 0, what);
          // With an amax a quarter of the data's: values beyond the range saturate to ±max.
          std::vector<float> small = host_values(cpu(), amax.c);
          for (float& a : small) a = std::isfinite(a) ? a / 4 : a;
          const Pair given = make_pair({groups}, DType::kF32, small);
          Pair sat = output_pair({rows, cols}, dt);
          cpu().float8_cast_with_amax(x.c, cast, pow2, given.c, sat.c);
          gpu().float8_cast_with_amax(x.g, cast, pow2, given.g, sat.g);
          BOOST_TEST(mismatches(host_values(gpu(), sat.g), host_values(cpu(), sat.c), dt) == 0, what + " saturated");
          // In place (dst = src), as float8_cast allows.
          const Tensor inplace = gpu_clone(x.g);
          gpu().float8_cast(inplace, cast, pow2, inplace);
          BOOST_TEST(mismatches(host_values(gpu(), inplace), host_values(cpu(), out.c), dt) == 0, what + " in place");
        }
  gpu().synchronize();
}

// The byte casts of the FP8 all-gather of FSDP shards (float8_quantize_bytes on the sending
// rank, float8_dequantize_bytes on the receiving one): the codes and the dequantized values equal
// the CPU device's bit for bit, f32 and bf16, with NaN / inf in the data, a saturating amax, an
// odd element count (the last i32 holds fewer than 4 codes) and the power-of-two scale rule.
BOOST_AUTO_TEST_CASE(fsdp_byte_casts_are_bit_exact_against_the_cpu) {
  const int64_t rows = 13, cols = 101, n = rows * cols;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (bool pow2 : {false, true})
      for (float amax_div : {1.0f, 4.0f}) {
        const std::string what = std::string(dtype_name(dt)) + (pow2 ? " pow2" : "") +
                                 (amax_div > 1 ? " saturated" : "");
        const Pair x = make_pair({n}, dt, cast_inputs(rows, cols, 11, dt == DType::kBF16));
        // The amax of the finite values (a NaN / inf amax would zero the scale for all).
        float amax = 0;
        for (float v : host_values(cpu(), x.c))
          if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
        const Pair a = make_pair({1}, DType::kF32, {amax / amax_div});
        Pair bytes{cpu().empty({(n + 3) / 4}, DType::kI32, MemCategory::kTemporaries),
                   gpu().empty({(n + 3) / 4}, DType::kI32, MemCategory::kTemporaries)};
        cpu().fill(bytes.c, 0.0f);
        gpu().fill(bytes.g, 0.0f);
        cpu().float8_quantize_bytes(x.c, Float8Format::kE4M3, pow2, a.c, bytes.c);
        gpu().float8_quantize_bytes(x.g, Float8Format::kE4M3, pow2, a.g, bytes.g);
        std::vector<uint8_t> got(size_t(bytes.g.nbytes()));
        gpu().download(got.data(), bytes.g, got.size());
        BOOST_TEST(std::memcmp(got.data(), bytes.c.raw(), got.size()) == 0, what + " codes");
        Pair out = output_pair({n}, dt);
        cpu().float8_dequantize_bytes(bytes.c, Float8Format::kE4M3, pow2, a.c, out.c);
        gpu().float8_dequantize_bytes(bytes.g, Float8Format::kE4M3, pow2, a.g, out.g);
        BOOST_TEST(mismatches(host_values(gpu(), out.g), host_values(cpu(), out.c), dt) == 0, what + " values");
        // The values are float8_cast_with_amax's for the same amax (the GEMM's cast of the
        // gathered weight then finds the same codes).
        Pair fq = output_pair({1, n}, dt);
        const Float8Cast tensorwise{true, Float8Format::kE4M3, Float8Scaling::kTensorwise};
        gpu().float8_cast_with_amax(x.g.reshape({1, n}), tensorwise, pow2, a.g, fq.g);
        BOOST_TEST(mismatches(host_values(gpu(), out.g), host_values(gpu(), fq.g), dt) == 0, what + " vs the cast");
      }
  gpu().synchronize();
}

namespace {

// One GEMM of a linear layer y = x·Wᵀ (x [M, K], W [N, K], dy [M, N]) under `recipe`, on both
// devices: the CPU's emulation as reference, the GPU's float8_matmul with `emulate`.
struct GemmCase {
  const char* name;
  Float8Cast Float8LinearRecipe::*a_cast;
  Float8Cast Float8LinearRecipe::*b_cast;
  bool trans_a, trans_b;
};
const GemmCase kGemms[] = {
    {"forward y = x Wt", &Float8LinearRecipe::output_x, &Float8LinearRecipe::output_w, false, true},
    {"grad-input dx = dy W", &Float8LinearRecipe::grad_input_dy, &Float8LinearRecipe::grad_input_w, false, false},
    {"grad-weight dW = dyt x", &Float8LinearRecipe::grad_weight_dy, &Float8LinearRecipe::grad_weight_x, true, false},
};

// Runs GEMM g with M tokens, K inputs, N outputs; `beta` 1 accumulates into a random C. Returns the
// normwise relative error of the GPU against the CPU.
double gemm_error(const Float8LinearRecipe& r, const GemmCase& g, DType dt, DType c_dt, float beta, bool emulate,
                  int64_t M, int64_t K, int64_t N, uint64_t seed) {
  const Pair x = random_pair({M, K}, dt, seed), w = random_pair({N, K}, dt, seed + 1);
  const Pair dy = random_pair({M, N}, dt, seed + 2, 1e-3f);  // gradients are small: e5m2's range matters
  const bool fwd = g.a_cast == &Float8LinearRecipe::output_x, dgrad = g.a_cast == &Float8LinearRecipe::grad_input_dy;
  const Pair& a = fwd ? x : dy;
  const Pair& b = fwd || dgrad ? w : x;
  const Shape cs = fwd ? Shape{M, N} : dgrad ? Shape{M, K} : Shape{N, K};
  Pair c = beta != 0.0f ? random_pair(cs, c_dt, seed + 3) : output_pair(cs, c_dt);
  const Float8Cast ca = r.*g.a_cast, cb = r.*g.b_cast;
  cpu().float8_matmul({a.c, ca, {}}, g.trans_a, {b.c, cb, {}}, g.trans_b, r.power_of_two, true, c.c, 1.0f, beta);
  gpu().float8_matmul({a.g, ca, {}}, g.trans_a, {b.g, cb, {}}, g.trans_b, r.power_of_two, emulate, c.g, 1.0f, beta);
  return rel_error(host_values(gpu(), c.g), host_values(cpu(), c.c));
}

}  // namespace

BOOST_AUTO_TEST_CASE(fp8_gemms_match_the_cpu_emulation) {
  auto& cuda = dynamic_cast<CudaDevice&>(gpu());
  for (const char* name : {"tensorwise", "rowwise", "rowwise_with_gw_hp"}) {
    const Float8LinearRecipe r = float8_linear_recipe(name);
    for (const GemmCase& g : kGemms) {
      const bool both = (r.*g.a_cast).quantize && (r.*g.b_cast).quantize;
      // Token counts that are and are not multiples of 16 (the grad-weight GEMM reduces over them).
      for (int64_t M : {64, 200}) {
        const auto before = cuda.float8_gemm_stats();
        const bool wgrad = g.a_cast == &Float8LinearRecipe::grad_weight_dy;
        // Gradients accumulate: the weight gradient into f32 with beta 1; dx once overwritten and
        // once accumulated (bf16).
        const DType c_dt = wgrad ? DType::kF32 : DType::kBF16;
        for (float beta : wgrad ? std::vector<float>{1.0f} : std::vector<float>{0.0f, 1.0f}) {
          const double e = gemm_error(r, g, DType::kBF16, c_dt, beta, false, M, 96, 160, 11);
          BOOST_TEST_MESSAGE(name << " " << g.name << " M " << M << " beta " << beta << ": rel err " << e);
          BOOST_CHECK_MESSAGE(e <= 1e-2, name << " " << g.name << " M " << M << " beta " << beta << ": rel err " << e);
        }
        const auto after = cuda.float8_gemm_stats();
        // Each GEMM with both operands quantized ran on cuBLASLt's FP8 kernels, not the fallback.
        BOOST_TEST(after.emulated == before.emulated, name << " " << g.name);
        if (both) BOOST_TEST(after.fp8 > before.fp8, name << " " << g.name);
      }
      // emulate = true: the GPU's own emulation, f32 end to end.
      const double e = gemm_error(r, g, DType::kF32, DType::kF32, 0.0f, true, 64, 96, 160, 21);
      BOOST_CHECK_MESSAGE(e <= 1e-5, name << " " << g.name << " emulated f32: rel err " << e);
    }
  }
  gpu().synchronize();
}

// A NaN in one token row of x: with rowwise scaling only that row of y is NaN (its scale is 0,
// the NaN's code is NaN); with tensorwise scaling all of y. Never a silently finite value.
BOOST_AUTO_TEST_CASE(fp8_gemm_propagates_non_finite_groups) {
  const int64_t M = 32, K = 64, N = 48;
  for (const char* name : {"tensorwise", "rowwise"}) {
    const Float8LinearRecipe r = float8_linear_recipe(name);
    std::vector<float> xv = randn(M * K, 5, 1.0f, true);
    xv[size_t(3 * K + 9)] = kNaN;
    const Tensor x = gpu().empty({M, K}, DType::kBF16, MemCategory::kTemporaries);
    set_values(gpu(), x, xv);
    const Tensor w = gpu().empty({N, K}, DType::kBF16, MemCategory::kTemporaries);
    set_values(gpu(), w, randn(N * K, 6, 1.0f, true));
    const Tensor y = gpu().empty({M, N}, DType::kBF16, MemCategory::kTemporaries);
    gpu().float8_matmul({x, r.output_x, {}}, false, {w, r.output_w, {}}, true, r.power_of_two, false, y, 1.0f, 0.0f);
    const std::vector<float> yv = host_values(gpu(), y);
    int64_t nan_in_row3 = 0, nan_elsewhere = 0;
    for (int64_t i = 0; i < M * N; ++i) (i / N == 3 ? nan_in_row3 : nan_elsewhere) += std::isnan(yv[size_t(i)]);
    BOOST_TEST(nan_in_row3 == N, name);
    BOOST_TEST(nan_elsewhere == (std::string(name) == "tensorwise" ? (M - 1) * N : 0), name);
  }
}

// A scaling group along an output dimension cannot be factored out of the GEMM: refused.
BOOST_AUTO_TEST_CASE(fp8_gemm_refuses_scales_along_the_output) {
  const Tensor x = gpu().zeros({32, 64}, DType::kBF16, MemCategory::kTemporaries);
  const Tensor w = gpu().zeros({48, 64}, DType::kBF16, MemCategory::kTemporaries);
  const Tensor y = gpu().empty({32, 48}, DType::kBF16, MemCategory::kTemporaries);
  const Float8Cast rows{true, Float8Format::kE4M3, Float8Scaling::kRowwise};
  const Float8Cast cols{true, Float8Format::kE4M3, Float8Scaling::kColumnwise};
  BOOST_CHECK_THROW(gpu().float8_matmul({x, cols, {}}, false, {w, rows, {}}, true, true, false, y, 1.0f, 0.0f),
                    std::invalid_argument);
}

int main(int argc, char** argv) { return gpu_test_main(argc, argv); }
