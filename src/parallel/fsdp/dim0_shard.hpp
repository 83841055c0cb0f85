#pragma once
/// @file Per-parameter dim-0 sharding (FSDP2 style, DESIGN.md data flow step 5): parameter p of
/// global shape [R, C…] is split over an fsdp group of N ranks into N row blocks of
/// ceil(R / N) rows; rank k holds rows [k·⌈R/N⌉, min(R, (k+1)·⌈R/N⌉)) — a rectangular hyperslab
/// of the global tensor (what sharded checkpoints read and write) — and pads its block to
/// ⌈R/N⌉ rows in communication buffers so every rank sends the same number of elements.
/// Foundation of the FSDP issue; the FSDP unit hooks build on it.
#include <cstdint>

#include "tensor/tensor.hpp"

namespace meshtrain {

/// One rank's block of a dim-0-sharded parameter. Units: rows of the global tensor, elements.
struct Dim0Shard {
  int64_t rows = 0;          ///< global rows R
  int64_t row_elems = 1;     ///< elements per row (product of the other dims)
  int64_t group = 1;         ///< N
  int64_t rank = 0;          ///< k
  int64_t rows_per_rank = 0; ///< ⌈R/N⌉ (the padded block height)
  int64_t first_row = 0;     ///< k·⌈R/N⌉, clamped to R
  int64_t local_rows = 0;    ///< rows really held (0 … ⌈R/N⌉; 0 when R < N for the last ranks)

  /// Elements of the padded block (what every rank sends), ⌈R/N⌉·row_elems.
  int64_t padded_elems() const { return rows_per_rank * row_elems; }
  /// Elements really held, local_rows·row_elems.
  int64_t local_elems() const { return local_rows * row_elems; }
};

/// The block of `rank` in a group of `group` ranks for a parameter of `global_shape`.
/// @throws std::invalid_argument for an empty shape, group < 1 or rank outside [0, group).
Dim0Shard dim0_shard(const Shape& global_shape, int64_t group, int64_t rank);

/// Copies rank k's rows of `full` (global, contiguous) into `padded` [padded_elems], zeroing
/// the padding rows.
void copy_shard_from_full(const Dim0Shard& s, const float* full, float* padded);
/// Scatters an all-gathered buffer — N padded blocks in rank order, N·padded_elems — back into
/// the global tensor `full`, dropping the padding.
void copy_full_from_gathered(const Dim0Shard& s, const float* gathered, float* full);

}  // namespace meshtrain
