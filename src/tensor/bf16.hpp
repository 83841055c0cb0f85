#pragma once
/// @file Host-side bfloat16 conversions (the top 16 bits of an IEEE-754 float32), as torch's
/// .to(torch.bfloat16): round to nearest, ties to even; NaN stays a quiet NaN.
#include <cstdint>
#include <cstring>

namespace meshtrain {

/// float32 → bfloat16 bits, round-to-nearest-even. Throws nothing.
inline uint16_t bf16_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

/// bfloat16 bits → float32 (exact). Throws nothing.
inline float float_from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace meshtrain
