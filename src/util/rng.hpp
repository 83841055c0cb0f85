#pragma once
/// @file Counter-based random numbers: every value is a pure function of (seed, stream, index),
/// so initialization does not depend on the layout, rank count or iteration order (DESIGN.md
/// data flow step 6). The mixer is SplitMix64 (Steele, Lea & Flood 2014) applied to a
/// combination of the three keys.
#include <cmath>
#include <cstdint>
#include <string_view>

namespace meshtrain {

/// SplitMix64 finalizer: a bijective 64-bit mix with full avalanche.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// 64-bit FNV-1a hash of a name (parameter names key the initialization streams).
inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

/// Uniform 64-bit value number `index` of stream `stream` under `seed`.
inline uint64_t counter_u64(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream)) + index);
}

/// Uniform double in (0, 1) from the top 53 bits (never exactly 0, so log() is safe).
inline double counter_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (double(counter_u64(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/// Standard normal value `index` of (seed, stream) by Box–Muller on two counter uniforms.
inline double counter_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = counter_uniform(seed, stream, 2 * index), u2 = counter_uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Normal(0, std) truncated to [-bound·std, bound·std] by resampling: attempt a of element
/// `index` uses counter index + a·2⁴⁰, so the value depends only on (seed, stream, index).
inline double counter_trunc_normal(uint64_t seed, uint64_t stream, uint64_t index, double std, double bound) {
  for (uint64_t a = 0;; ++a) {
    const double z = counter_normal(seed, stream, index + (a << 40));
    if (std::fabs(z) <= bound) return z * std;
  }
}

}  // namespace meshtrain
