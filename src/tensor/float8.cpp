#include "tensor/float8.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace meshtrain {

Float8Limits float8_limits(Float8Format f) {
  return f == Float8Format::kE4M3 ? Float8Limits{3, -6, 448.0f} : Float8Limits{2, -14, 57344.0f};
}

Float8Format parse_float8_format(const std::string& name) {
  if (name == "e4m3") return Float8Format::kE4M3;
  if (name == "e5m2") return Float8Format::kE5M2;
  throw std::invalid_argument("float8 format '" + name + "' (e4m3 | e5m2)");
}

float float8_round(float x, Float8Format f) {
  if (std::isnan(x)) return x;
  const Float8Limits l = float8_limits(f);
  const float a = std::fabs(x);
  if (a >= l.max) return std::copysign(l.max, x);  // saturation (and ±inf)
  if (a == 0.0f) return x;
  // The grid spacing at |x|: 2^(e − mantissa_bits) for x in [2^e, 2^(e+1)), the subnormal
  // spacing below the smallest normal. a · 2^−(…) and k · q are exact (powers of two, far from
  // float32's range limits), so the only rounding is rint's: to nearest, ties to even (the
  // default rounding mode). A mantissa that rounds up into the next binade lands on its first
  // value, still exact. e comes from the float32 exponent field (a float32 subnormal reads as
  // −127, below both formats' smallest normal, as its true exponent is): one cast of a large
  // activation runs this per element, so no frexp / ldexp calls.
  const int e = int(std::bit_cast<uint32_t>(a) >> 23) - 127;
  const int exp = std::max(e, l.min_normal_exp);
  const float q = std::bit_cast<float>(uint32_t(exp - l.mantissa_bits + 127) << 23);
  const float inv_q = std::bit_cast<float>(uint32_t(l.mantissa_bits - exp + 127) << 23);
  return std::copysign(std::rint(a * inv_q) * q, x);
}

float float8_scale(float amax, Float8Format f, bool power_of_two) {
  // TorchAO clamps in float64 (torch.clamp(NaN) is NaN) and casts the quotient to float32.
  const double clamped = std::isnan(amax) ? double(amax) : std::max(double(amax), 1e-12);
  const float s = float(double(float8_limits(f).max) / clamped);
  if (!power_of_two || !std::isfinite(s) || s == 0.0f) return s;
  int e = 0;
  std::frexp(s, &e);
  return std::ldexp(1.0f, e - 1);
}

int64_t float8_group_count(int64_t rows, int64_t cols, Float8Scaling scaling) {
  return scaling == Float8Scaling::kTensorwise ? 1 : scaling == Float8Scaling::kRowwise ? rows : cols;
}

namespace {
// amax [float8_group_count] per scaling group of x [rows, cols]; a NaN sticks (torch.max
// propagates it, so the group's scale is NaN). The group of element (r, c) is
// g_row[r] + g_col[c]: one of the two strides is 0.
void amax_nan_sticky(const float* x, int64_t rows, int64_t cols, Float8Scaling scaling, float* amax) {
  const int64_t row_stride = scaling == Float8Scaling::kRowwise ? 1 : 0;
  const int64_t col_stride = scaling == Float8Scaling::kColumnwise ? 1 : 0;
  std::fill(amax, amax + float8_group_count(rows, cols, scaling), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* m = amax + r * row_stride;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = std::fabs(xr[c]);
      float& mc = m[c * col_stride];
      if (!(v <= mc)) mc = std::isnan(mc) ? mc : v;  // v > mc, or v NaN
    }
  }
}

// out[r, c] = float8_round(x[r, c] · s_g) / s_g, s_g the scale of the element's group.
void scaled_round(const float* x, int64_t rows, int64_t cols, Float8Format f, Float8Scaling scaling, const float* s,
                  float* out) {
  const int64_t row_stride = scaling == Float8Scaling::kRowwise ? 1 : 0;
  const int64_t col_stride = scaling == Float8Scaling::kColumnwise ? 1 : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* orow = out + r * cols;
    const float* sr = s + r * row_stride;
    for (int64_t c = 0; c < cols; ++c) {
      const float sc = sr[c * col_stride];
      orow[c] = float8_round(xr[c] * sc, f) / sc;
    }
  }
}
}  // namespace

void float8_fake_quantize(const float* x, int64_t rows, int64_t cols, Float8Format f, Float8Scaling scaling,
                          bool power_of_two, float* out, float* scales) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("float8_fake_quantize: negative size [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  std::vector<float> amax(static_cast<size_t>(float8_group_count(rows, cols, scaling)));
  amax_nan_sticky(x, rows, cols, scaling, amax.data());
  std::vector<float> s(amax.size());
  for (size_t g = 0; g < s.size(); ++g) s[g] = float8_scale(amax[g], f, power_of_two);
  scaled_round(x, rows, cols, f, scaling, s.data(), out);
  if (scales) std::copy(s.begin(), s.end(), scales);
}

void float8_group_amax(const float* x, int64_t rows, int64_t cols, Float8Scaling scaling, float* amax) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("float8_group_amax: negative size [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  amax_nan_sticky(x, rows, cols, scaling, amax);
  for (int64_t g = 0; g < float8_group_count(rows, cols, scaling); ++g)
    if (std::isnan(amax[g])) amax[g] = INFINITY;
}

void float8_quantize_with_amax(const float* x, int64_t rows, int64_t cols, Float8Format f, Float8Scaling scaling,
                               bool power_of_two, const float* amax, float* out) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("float8_quantize_with_amax: negative size [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  std::vector<float> s(static_cast<size_t>(float8_group_count(rows, cols, scaling)));
  for (size_t g = 0; g < s.size(); ++g) s[g] = float8_scale(amax[g], f, power_of_two);
  scaled_round(x, rows, cols, f, scaling, s.data(), out);
}

Float8LinearRecipe float8_linear_recipe(const std::string& name) {
  using F = Float8Format;
  using S = Float8Scaling;
  const auto cast = [](F f, S s) { return Float8Cast{true, f, s}; };
  Float8LinearRecipe r;
  r.name = name;
  if (name == "tensorwise") {
    r.output_x = r.output_w = r.grad_input_w = r.grad_weight_x = cast(F::kE4M3, S::kTensorwise);
    r.grad_input_dy = r.grad_weight_dy = cast(F::kE5M2, S::kTensorwise);
    return r;
  }
  if (name == "rowwise" || name == "rowwise_with_gw_hp") {
    r.power_of_two = true;
    r.output_x = r.output_w = r.grad_input_dy = cast(F::kE4M3, S::kRowwise);
    if (name == "rowwise") {
      r.grad_input_w = cast(F::kE4M3, S::kColumnwise);
      r.grad_weight_dy = r.grad_weight_x = cast(F::kE4M3, S::kColumnwise);
    } else {
      r.grad_input_w = cast(F::kE4M3, S::kTensorwise);  // grad_weight stays high precision
    }
    return r;
  }
  throw std::invalid_argument("float8 recipe '" + name + "' (tensorwise | rowwise | rowwise_with_gw_hp)");
}

void float8_cast_operand(const float* x, int64_t rows, int64_t cols, const Float8Cast& cast, bool power_of_two,
                         float* out) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("float8_cast_operand: negative size [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  if (!cast.quantize) {
    if (out != x) std::copy(x, x + rows * cols, out);
    return;
  }
  float8_fake_quantize(x, rows, cols, cast.format, cast.scaling, power_of_two, out);
}

}  // namespace meshtrain
