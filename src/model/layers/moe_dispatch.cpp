#include "model/layers/moe_dispatch.hpp"

#include <stdexcept>
#include <string>

namespace meshtrain {

MoeDispatchPlan plan_dispatch(const int32_t* topk, int64_t n, int64_t k, int64_t e) {
  MoeDispatchPlan p;
  p.counts.assign(size_t(e), 0);
  for (int64_t i = 0; i < n * k; ++i) {
    if (topk[i] < 0 || topk[i] >= e)
      throw std::out_of_range("MoE routing: expert " + std::to_string(topk[i]) + " outside [0, " + std::to_string(e) +
                              ")");
    ++p.counts[size_t(topk[i])];
  }
  std::vector<int64_t> next(size_t(e), 0);
  for (int64_t x = 1; x < e; ++x) next[size_t(x)] = next[size_t(x - 1)] + p.counts[size_t(x - 1)];
  p.src.resize(size_t(n * k));
  p.rows.resize(size_t(n * k));
  for (int64_t i = 0; i < n * k; ++i) {
    const int64_t row = next[size_t(topk[i])]++;
    p.src[size_t(row)] = int32_t(i / k);
    p.rows[size_t(i)] = int32_t(row);
  }
  return p;
}

TokenPlaces token_places(const SequenceShard& shard, int64_t batch, int64_t first, int64_t n) {
  const int64_t c = shard.chunk_len, total = batch * shard.local_len();
  if (first < 0 || n < 0 || first + n > total)
    throw std::invalid_argument("token_places: rows [" + std::to_string(first) + ", " + std::to_string(first + n) +
                                ") outside the micro-batch's " + std::to_string(total));
  TokenPlaces t;
  t.sample.resize(size_t(n));
  t.position.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = first + i;  // [chunks, B, C] row-major
    t.sample[size_t(i)] = int32_t((g / c) % batch);
    t.position[size_t(i)] = shard.position(size_t(g / (batch * c)), g % c);
  }
  return t;
}

}  // namespace meshtrain
