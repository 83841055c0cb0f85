#pragma once
/// @file Float8 emulation on the CPU: the rounding of a float32 value onto the OCP 8-bit
/// floating-point formats and TorchAO's dynamic scaling, as a quantize → dequantize in float32
/// ("fake quantization"). It is what a GEMM operand goes through under Float8 training before
/// an fp32 GEMM (TorchTitan's [quantize.linear.float8] with emulate = true; NVIDIA's FP8 GEMMs
/// read the same codes).
///
/// Formats (OCP "OCP 8-bit Floating Point Specification (OFP8)", 2023; torch.float8_e4m3fn and
/// torch.float8_e5m2):
///   e4m3: 4 exponent bits (bias 7), 3 mantissa bits; normals from 2^-6, subnormals in steps of
///         2^-9, largest finite ±448; no infinities (the "fn" variant);
///   e5m2: 5 exponent bits (bias 15), 2 mantissa bits; normals from 2^-14, subnormals in steps
///         of 2^-16, largest finite ±57344 (and ±inf, never produced here).
/// Rounding is to nearest, ties to the even code, with saturation: |x| beyond the largest
/// finite value (±inf included) becomes ±max, as TorchAO's to_fp8_saturated clamps before its
/// cast; NaN stays NaN; −0 stays −0.
///
/// Dynamic scaling (TorchAO torchao/float8/float8_utils.py, amax_to_scale; the scaled cast of
/// float8_training_tensor.py): from amax = max |x| over the scaling group,
///   scale = float32(fmax / max(amax, 1e-12))   (the division in float64, as TorchAO),
///   optionally rounded down to a power of two (TorchTitan's rowwise recipes), then
///   q = round_saturate(float32(x · scale)) and the dequantized value is float32(q / scale).
/// Groups: the whole tensor (tensorwise), each row of a row-major [R, C] matrix (rowwise: the
/// GEMM operand scaled along its reduction dimension C) or each column (the operands whose
/// reduction dimension is their rows, e.g. the weight-gradient GEMM's).
/// A NaN or ±inf in a group makes amax non-finite: its scale is then NaN or 0 and every value of
/// the group dequantizes to NaN (inf · 0), which the trainer's non-finite check catches.
#include <cstdint>
#include <string>

namespace meshtrain {

enum class Float8Format { kE4M3, kE5M2 };

/// The format's constants. mantissa_bits: 3 or 2; min_normal_exp: log2 of the smallest normal
/// (−6 or −14); max: the largest finite value (448 or 57344).
struct Float8Limits {
  int mantissa_bits;
  int min_normal_exp;
  float max;
};

/// Constants of `f`. Throws nothing.
Float8Limits float8_limits(Float8Format f);

/// Parses "e4m3" / "e5m2". @throws std::invalid_argument naming the text otherwise.
Float8Format parse_float8_format(const std::string& name);

/// x rounded to the nearest value of format f (ties to even), saturated to ±max; NaN → NaN.
/// The result is a float32 holding a value f represents exactly. Throws nothing.
float float8_round(float x, Float8Format f);

/// TorchAO's scale from an amax (≥ 0, or NaN / inf): float32(max / max(amax, 1e-12)) computed in
/// float64, then with power_of_two the largest power of two ≤ it (exact, from the exponent; a
/// NaN or 0 scale passes through). Throws nothing.
float float8_scale(float amax, Float8Format f, bool power_of_two);

/// The scaling groups of float8_fake_quantize.
enum class Float8Scaling { kTensorwise, kRowwise, kColumnwise };

/// Quantize → dequantize of the row-major float32 matrix x [rows, cols] into out (may alias x):
/// out = float32(float8_round(float32(x · s)) / s) with s the scale of the element's group
/// (float8_scale of the group's amax). scales, when non-null, receives the scales used: 1
/// value (tensorwise), `rows` (rowwise) or `cols` (columnwise).
/// @throws std::invalid_argument for negative sizes.
void float8_fake_quantize(const float* x, int64_t rows, int64_t cols, Float8Format f, Float8Scaling scaling,
                          bool power_of_two, float* out, float* scales = nullptr);

/// The number of scaling groups of an x [rows, cols] under `scaling`: 1, rows or cols.
int64_t float8_group_count(int64_t rows, int64_t cols, Float8Scaling scaling);

/// The first half of float8_fake_quantize for groups that span ranks (an operand split over a
/// tensor-parallel group: TorchAO computes the amax of the whole DTensor): amax per group of
/// the row-major x [rows, cols] into amax [float8_group_count]. A group holding a NaN or ±inf
/// reports +inf, so that a max over the ranks keeps it (MPI's max of a NaN is unspecified) and
/// its scale is 0: every value of the group then dequantizes to NaN, as with a local NaN amax.
/// @throws std::invalid_argument for negative sizes.
void float8_group_amax(const float* x, int64_t rows, int64_t cols, Float8Scaling scaling, float* amax);

/// The second half: out = float32(float8_round(float32(x · s)) / s) with s = float8_scale of the
/// group's given amax (amax [float8_group_count], e.g. reduced with max over the ranks sharing
/// the groups). Equal amax, equal result: bit-identical to float8_fake_quantize for finite data.
/// out may alias x. @throws std::invalid_argument for negative sizes.
void float8_quantize_with_amax(const float* x, int64_t rows, int64_t cols, Float8Format f, Float8Scaling scaling,
                               bool power_of_two, const float* amax, float* out);

/// How a Float8 recipe casts one GEMM operand: not at all (`quantize` false: high precision), or
/// to `format` with scales per `scaling` group of the operand as stored (row-major).
struct Float8Cast {
  bool quantize = false;
  Float8Format format = Float8Format::kE4M3;
  Float8Scaling scaling = Float8Scaling::kTensorwise;
};

/// The operand casts of a linear layer y = x·Wᵀ and its two gradient GEMMs under one of
/// TorchAO's recipes (torchao/float8/config.py, Float8LinearConfig.from_recipe_name; the names
/// TorchTitan's [quantize.linear.float8] recipe_name takes). Shapes: x [M, K], W [N, K] (as
/// stored, PyTorch's [out, in]), dy [M, N]; the three GEMMs
///   y  [M, N] = x · Wᵀ     (reduction over K: x and W scaled along their rows),
///   dx [M, K] = dy · W     (over N: dy along its rows, W along its columns),
///   dW [N, K] = dyᵀ · x    (over M: dy and x along their columns).
///   tensorwise:          every operand tensorwise; x and W e4m3, dy e5m2;
///   rowwise:             every operand e4m3, scaled along the GEMM's reduction dimension;
///   rowwise_with_gw_hp:  y as rowwise; dx from dy rowwise and W tensorwise, both e4m3; dW in
///                        high precision (neither operand cast).
/// The rowwise recipes round their scales down to powers of two (power_of_two). emulate is
/// TorchAO's Float8LinearConfig.emulate: quantize → dequantize and high-precision GEMMs instead
/// of FP8 GEMMs (Device::float8_matmul; devices without FP8 GEMMs always emulate).
struct Float8LinearRecipe {
  std::string name;
  bool power_of_two = false;
  bool emulate = false;
  Float8Cast output_x, output_w;
  Float8Cast grad_input_dy, grad_input_w;
  Float8Cast grad_weight_dy, grad_weight_x;
};

/// The recipe called `name`: "tensorwise", "rowwise" or "rowwise_with_gw_hp".
/// @throws std::invalid_argument naming it otherwise.
Float8LinearRecipe float8_linear_recipe(const std::string& name);

/// One operand x [rows, cols] through its cast into out (may alias x): a copy when the cast is
/// high precision, else float8_fake_quantize with the recipe's power-of-two rule.
/// @throws std::invalid_argument for negative sizes.
void float8_cast_operand(const float* x, int64_t rows, int64_t cols, const Float8Cast& cast, bool power_of_two,
                         float* out);

}  // namespace meshtrain
