#pragma once
/// @file The host side of token-choice routing: which expert-sorted row each (token, choice)
/// lands in, and where each token sits in its sequence (for the sequence-wise balance loss and
/// the forced round-robin routing of tests).
#include <cstdint>
#include <vector>

#include "parallel/context/context_parallel.hpp"

namespace meshtrain {

/// Tokens grouped by expert for the grouped GEMM. R = N·k routed rows.
struct MoeDispatchPlan {
  std::vector<int64_t> counts;  ///< [E] rows per expert (tokens routed to it)
  std::vector<int32_t> src;     ///< [R] token row of each expert-sorted row
  std::vector<int32_t> rows;    ///< [N, k] expert-sorted row of token n's j-th choice
};

/// A stable counting sort of the routing topk i32 [N, k] (expert ids in [0, E)) by expert:
/// within an expert, rows keep (token, choice) order, so the result and every sum over it are
/// deterministic. O(N·k + E). @throws std::out_of_range for an expert id outside [0, E).
MoeDispatchPlan plan_dispatch(const int32_t* topk, int64_t n, int64_t k, int64_t e);

/// Sample and sequence position of each of this rank's token rows.
struct TokenPlaces {
  std::vector<int32_t> sample;    ///< [N] sample of the micro-batch, in [0, B)
  std::vector<int64_t> position;  ///< [N] position in the sample's sequence, in [0, T)
};

/// The places of rows [first, first + n) of a micro-batch of `batch` samples laid out as
/// StepContext::tokens is (chunk-major [chunks, B, C], context_parallel.hpp); under sequence
/// parallelism `first` is the tp rank's first row. @throws std::invalid_argument when the rows
/// exceed the micro-batch.
TokenPlaces token_places(const SequenceShard& shard, int64_t batch, int64_t first, int64_t n);

}  // namespace meshtrain
