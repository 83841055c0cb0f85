#include "parallel/context/context_parallel.hpp"

#include <stdexcept>

namespace meshtrain {

CpRotate cp_rotate_from_name(const std::string& name) {
  if (name == "allgather") return CpRotate::kAllGather;
  if (name == "alltoall") return CpRotate::kAllToAll;
  if (name == "ulysses") return CpRotate::kUlysses;
  throw std::invalid_argument("context_parallel_rotate_method \"" + name + "\" is not allgather, alltoall or ulysses");
}

CpBalancer cp_balancer_from_name(const std::string& name) {
  if (name == "headtail") return CpBalancer::kHeadTail;
  if (name == "none") return CpBalancer::kNone;
  throw std::invalid_argument("context_parallel_load_balancer \"" + name + "\" is not headtail or none");
}

const char* cp_rotate_name(CpRotate r) {
  switch (r) {
    case CpRotate::kAllGather: return "allgather";
    case CpRotate::kAllToAll: return "alltoall";
    case CpRotate::kUlysses: return "ulysses";
  }
  return "?";
}

SequenceShard sequence_shard(int64_t seq_len, int64_t cp, int64_t rank, CpBalancer balancer) {
  if (cp < 1 || rank < 0 || rank >= cp)
    throw std::invalid_argument("sequence_shard: cp rank " + std::to_string(rank) + " of " + std::to_string(cp));
  SequenceShard s;
  s.seq_len = seq_len;
  if (cp == 1) {
    s.chunk_len = seq_len;
    s.chunks = {0};
    return s;
  }
  if (seq_len % (2 * cp))
    throw std::invalid_argument("sequence_shard: seq_len " + std::to_string(seq_len) + " is not divisible by 2·cp = " +
                                std::to_string(2 * cp));
  s.chunk_len = seq_len / (2 * cp);
  s.chunks = balancer == CpBalancer::kHeadTail ? std::vector<int64_t>{rank, 2 * cp - 1 - rank}
                                               : std::vector<int64_t>{2 * rank, 2 * rank + 1};
  return s;
}

void shard_samples(const SequenceShard& shard, const int32_t* samples, int64_t n, int32_t* inputs,
                   int32_t* targets) {
  const int64_t c_len = shard.chunk_len, row = shard.seq_len + 1;
  int64_t at = 0;
  for (size_t c = 0; c < shard.chunks.size(); ++c)
    for (int64_t b = 0; b < n; ++b)
      for (int64_t t = 0; t < c_len; ++t, ++at) {
        const int64_t pos = shard.position(c, t);
        inputs[at] = samples[b * row + pos];
        targets[at] = samples[b * row + pos + 1];
      }
}

std::vector<int32_t> unshard_tokens(const std::vector<int32_t>& all, int64_t n, int64_t seq_len, int64_t cp,
                                    CpBalancer balancer) {
  if (int64_t(all.size()) != n * seq_len)
    throw std::invalid_argument("unshard_tokens: " + std::to_string(all.size()) + " values for " + std::to_string(n) +
                                " samples of " + std::to_string(seq_len) + " tokens");
  std::vector<int32_t> out(all.size());
  int64_t at = 0;
  for (int64_t r = 0; r < cp; ++r) {
    const SequenceShard s = sequence_shard(seq_len, cp, r, balancer);
    for (size_t c = 0; c < s.chunks.size(); ++c)
      for (int64_t b = 0; b < n; ++b)
        for (int64_t t = 0; t < s.chunk_len; ++t) out[size_t(b * seq_len + s.position(c, t))] = all[size_t(at++)];
  }
  return out;
}

}  // namespace meshtrain
