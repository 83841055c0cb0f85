#include "parallel/fsdp/dim0_shard.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace meshtrain {

Dim0Shard dim0_shard(const Shape& global_shape, int64_t group, int64_t rank) {
  if (global_shape.empty()) throw std::invalid_argument("dim0_shard of a 0-d tensor");
  if (group < 1 || rank < 0 || rank >= group)
    throw std::invalid_argument("dim0_shard: rank " + std::to_string(rank) + " of a group of " + std::to_string(group));
  Dim0Shard s;
  s.rows = global_shape[0];
  s.row_elems = shape_numel(global_shape) / std::max<int64_t>(1, s.rows);
  s.group = group;
  s.rank = rank;
  s.rows_per_rank = (s.rows + group - 1) / group;
  s.first_row = std::min(s.rows, rank * s.rows_per_rank);
  s.local_rows = std::min(s.rows, s.first_row + s.rows_per_rank) - s.first_row;
  return s;
}

void copy_shard_from_full(const Dim0Shard& s, const float* full, float* padded) {
  std::memcpy(padded, full + s.first_row * s.row_elems, sizeof(float) * size_t(s.local_elems()));
  std::memset(padded + s.local_elems(), 0, sizeof(float) * size_t(s.padded_elems() - s.local_elems()));
}

void copy_full_from_gathered(const Dim0Shard& s, const float* gathered, float* full) {
  for (int64_t k = 0; k < s.group; ++k) {
    const int64_t first = std::min(s.rows, k * s.rows_per_rank);
    const int64_t rows = std::min(s.rows, first + s.rows_per_rank) - first;
    std::memcpy(full + first * s.row_elems, gathered + k * s.padded_elems(), sizeof(float) * size_t(rows * s.row_elems));
  }
}

}  // namespace meshtrain
