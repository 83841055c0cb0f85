#pragma once
/// @file The Float8 arithmetic of tensor/float8.cpp written once for host and device code: the
/// CUDA cast kernels (float8.cu) call these functions, and the CPU unit test test_float8 checks
/// them against tensor/float8.cpp over every float32 exponent and every 8-bit code, so the GPU
/// casts round exactly as the CPU emulation without a GPU to test on. Plain C++ outside nvcc
/// (no CUDA headers needed).
///
/// Formats and rounding: OCP "8-bit Floating Point Specification (OFP8)" (2023) and Micikevicius
/// et al. 2022, "FP8 Formats for Deep Learning": e4m3 (bias 7, no infinities, NaN = S.1111.111,
/// largest finite 448 = S.1111.110) and e5m2 (bias 15, largest finite 57344 = S.11110.11).
/// Rounding to nearest, ties to even, saturating to ±max (TorchAO's to_fp8_saturated); the scale
/// rule is TorchAO's amax_to_scale (torchao/float8/float8_utils.py).
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define MT_F8_FN __host__ __device__ __forceinline__
#else
#define MT_F8_FN inline
#endif

namespace meshtrain::f8 {

/// A format's constants, as tensor/float8.hpp's Float8Limits (e4m3: 3, −6, 448; e5m2: 2, −14,
/// 57344); a plain struct so kernels take it by value.
struct Format {
  int mantissa_bits;
  int min_normal_exp;
  float max;
};
MT_F8_FN Format e4m3() { return {3, -6, 448.0f}; }
MT_F8_FN Format e5m2() { return {2, -14, 57344.0f}; }

MT_F8_FN uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
MT_F8_FN float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/// float8_round (tensor/float8.cpp), operation for operation: x rounded to the nearest value of
/// f, ties to even, saturated to ±max; NaN stays NaN, −0 stays −0. The product a · 2^−(…) and
/// the multiplication by the spacing are exact, so rintf's (round half to even) is the only
/// rounding, on host and device alike.
MT_F8_FN float round(float x, Format f) {
  if (x != x) return x;
  const float a = fabsf(x);
  if (a >= f.max) return copysignf(f.max, x);
  if (a == 0.0f) return x;
  const int e = int(bits_of(a) >> 23) - 127;
  const int exp = e > f.min_normal_exp ? e : f.min_normal_exp;
  const float q = float_of(uint32_t(exp - f.mantissa_bits + 127) << 23);
  const float inv_q = float_of(uint32_t(f.mantissa_bits - exp + 127) << 23);
  return copysignf(rintf(a * inv_q) * q, x);
}

/// float8_scale: float32(max / max(amax, 1e-12)) with the division in float64; with
/// power_of_two the largest power of two ≤ it (a NaN, 0 or inf scale passes through). For a
/// positive finite float32, that power of two is its exponent field alone (normal) or its
/// highest set bit (subnormal): exactly frexp / ldexp's answer.
MT_F8_FN float scale(float amax, Format f, bool power_of_two) {
  const double a = double(amax);
  const double clamped = a != a ? a : (a < 1e-12 ? 1e-12 : a);
  const float s = float(double(f.max) / clamped);
  if (!power_of_two || s != s || s == 0.0f || s == INFINITY) return s;
  const uint32_t u = bits_of(s);
  if (u & 0x7F800000u) return float_of(u & 0x7F800000u);
  uint32_t p = 1u << 22;
  while (p > u) p >>= 1;
  return float_of(p);
}

/// The amax key of one element: the bits of |x| as an unsigned integer, a NaN mapped to +inf's
/// bits. For non-negative floats integer order is value order, so a max over keys (also
/// atomicMax) gives the group's amax, and +inf for a group holding a NaN or ±inf
/// (float8_group_amax's rule).
MT_F8_FN uint32_t amax_key(float x) {
  const uint32_t a = bits_of(x) & 0x7FFFFFFFu;
  return a > 0x7F800000u ? 0x7F800000u : a;
}

/// The 8-bit code of q, a value f represents exactly (round's output): sign, exponent field
/// (e − min_normal_exp + 1, 0 for subnormals), mantissa. NaN → S.1111111 (e4m3's NaN; an e5m2
/// NaN too). Behaviour for other inputs is unspecified.
MT_F8_FN uint8_t encode(float q, Format f) {
  const uint32_t u = bits_of(q);
  const uint32_t sign = (u >> 24) & 0x80u;
  if (q != q) return uint8_t(sign | 0x7Fu);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a == 0) return uint8_t(sign);
  const int e = int(a >> 23) - 127;
  if (e < f.min_normal_exp) {  // subnormal: |q| / 2^(min_normal_exp − mantissa_bits), an integer
    const float m = float_of(a) * float_of(uint32_t(f.mantissa_bits - f.min_normal_exp + 127) << 23);
    return uint8_t(sign | uint32_t(m));
  }
  const uint32_t field = uint32_t(e - f.min_normal_exp + 1);
  const uint32_t mant = (a >> (23 - f.mantissa_bits)) & ((1u << f.mantissa_bits) - 1u);
  return uint8_t(sign | (field << f.mantissa_bits) | mant);
}

/// The value of code c in f (e4m3's S.1111111 and e5m2's S.11111.xx other than inf: NaN; e5m2's
/// S.11111.00: ±inf). The inverse of encode; used by tests.
MT_F8_FN float decode(uint8_t c, Format f) {
  const int mbits = f.mantissa_bits, ebits = 7 - mbits;
  const uint32_t field = (c >> mbits) & ((1u << ebits) - 1u), mant = c & ((1u << mbits) - 1u);
  const float sign = (c & 0x80u) ? -1.0f : 1.0f;
  const bool e4 = mbits == 3;
  if (e4 && field == 15 && mant == 7) return NAN;
  if (!e4 && field == 31) return mant ? NAN : sign * INFINITY;
  if (field == 0) return sign * float(mant) * ldexpf(1.0f, f.min_normal_exp - mbits);
  return sign * float((1u << mbits) | mant) * ldexpf(1.0f, int(field) - 1 + f.min_normal_exp - mbits);
}

}  // namespace meshtrain::f8
