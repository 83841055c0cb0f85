#include "model/init.hpp"

#include "util/rng.hpp"

namespace meshtrain {

float init_value(const Parameter& p, uint64_t seed, uint64_t name_hash, int64_t i) {
  switch (p.init.kind) {
    case InitSpec::Kind::kOnes: return 1.0f;
    case InitSpec::Kind::kNormal: return float(counter_normal(seed, name_hash, uint64_t(i)) * p.init.std);
    case InitSpec::Kind::kTruncNormal:
      return float(counter_trunc_normal(seed, name_hash, uint64_t(i), p.init.std, p.init.bound));
  }
  return 0.0f;
}

void init_range(const Parameter& p, uint64_t seed, int64_t first, int64_t count, float* host) {
  const uint64_t h = fnv1a64(p.name);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) host[i] = init_value(p, seed, h, global_flat_index(p, first + i));
}

}  // namespace meshtrain
