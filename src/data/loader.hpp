#pragma once
/// @file DataLoader: fixed-length samples in a global order fixed by the seed, split across
/// data-parallel ranks by sample index. Its whole state is one global cursor (samples consumed),
/// so it re-splits over any number of dp ranks (DESIGN.md data flow step 7).
#include <cstdint>
#include <vector>

#include "data/token_store.hpp"

namespace meshtrain {

/// Samples of seq_len + 1 consecutive tokens taken with stride seq_len from one split's token
/// stream (inputs are tokens[0:T], targets tokens[1:T+1]). Epoch e visits all samples in a
/// permutation that is a pure function of (seed, e); global sample index g maps to epoch
/// g / num_samples() and position g % num_samples() in that epoch's permutation.
class DataLoader {
 public:
  /// @throws DataError when the split holds fewer than seq_len + 1 tokens.
  DataLoader(const TokenSplit& split, int64_t seq_len, uint64_t seed, bool shuffle = true);

  int64_t seq_len() const { return seq_len_; }
  int64_t num_samples() const { return num_samples_; }  ///< samples per epoch

  /// Writes samples with global indices [first, first + count) into out, row-major
  /// [count, seq_len + 1] token ids.
  void fetch(int64_t first, int64_t count, int32_t* out) const;

  /// Global cursor: number of samples consumed by all dp ranks so far.
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t c) { cursor_ = c; }

  /// The samples of micro-batch `micro` of the current step for dp rank `dp_rank`:
  /// global indices cursor + (micro·dp_size + dp_rank)·local_batch + [0, local_batch).
  /// Output [local_batch, seq_len + 1].
  void micro_batch(int64_t micro, int64_t dp_rank, int64_t dp_size, int64_t local_batch, int32_t* out) const;
  /// Moves the cursor past one global batch of `global_batch` samples.
  void advance(int64_t global_batch) { cursor_ += global_batch; }

 private:
  int64_t sample_position(int64_t global_index) const;  ///< start token of a global sample
  const TokenSplit& split_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t num_samples_;
  int64_t cursor_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace meshtrain
