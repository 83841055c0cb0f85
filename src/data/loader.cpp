#include "data/loader.hpp"

#include <cstring>
#include <numeric>

#include "util/errors.hpp"
#include "util/rng.hpp"

namespace meshtrain {

DataLoader::DataLoader(const TokenSplit& split, int64_t seq_len, uint64_t seed, bool shuffle)
    : split_(split), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  const int64_t n = int64_t(split.tokens.size());
  num_samples_ = n > seq_len ? (n - 1) / seq_len : 0;
  if (num_samples_ == 0)
    throw DataError("split holds " + std::to_string(n) + " tokens, fewer than seq_len + 1 = " +
                    std::to_string(seq_len + 1) + " (use a larger corpus or a smaller [training] seq_len)");
}

int64_t DataLoader::sample_position(int64_t g) const {
  const int64_t epoch = g / num_samples_, pos = g % num_samples_;
  if (!shuffle_) return pos * seq_len_;
  if (epoch != cached_epoch_) {
    // Fisher–Yates driven by the counter RNG: the permutation is a pure function of (seed, epoch).
    perm_.resize(size_t(num_samples_));
    std::iota(perm_.begin(), perm_.end(), int64_t(0));
    for (int64_t i = num_samples_ - 1; i > 0; --i) {
      const int64_t j = int64_t(counter_u64(seed_, 0x5A3D1E00ull + uint64_t(epoch), uint64_t(i)) % uint64_t(i + 1));
      std::swap(perm_[size_t(i)], perm_[size_t(j)]);
    }
    cached_epoch_ = epoch;
  }
  return perm_[size_t(pos)] * seq_len_;
}

void DataLoader::fetch(int64_t first, int64_t count, int32_t* out) const {
  for (int64_t s = 0; s < count; ++s) {
    const int64_t start = sample_position(first + s);
    std::memcpy(out + s * (seq_len_ + 1), split_.tokens.data() + start, sizeof(int32_t) * size_t(seq_len_ + 1));
  }
}

void DataLoader::micro_batch(int64_t micro, int64_t dp_rank, int64_t dp_size, int64_t local_batch, int32_t* out) const {
  fetch(cursor_ + (micro * dp_size + dp_rank) * local_batch, local_batch, out);
}

}  // namespace meshtrain
