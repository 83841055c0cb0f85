#pragma once
/// @file The token exchange of expert parallelism (GShard's dispatch / combine all-to-all,
/// Lepikhin et al. 2021). Rank q of an ep group of P ranks holds experts [q·L, (q+1)·L), L = E/P.
/// A rank's routed rows, sorted by expert (plan_dispatch), are therefore already in destination
/// order: block q of them goes to rank q. What arrives is ordered (source rank, local expert);
/// the grouped GEMM needs (local expert, source rank), so the rows are permuted after the
/// all-to-all and back before the return all-to-all.
#include <cstdint>
#include <vector>

namespace meshtrain {

/// One micro-batch's exchange on one rank. Row counts in rows of D elements.
struct EpExchange {
  std::vector<int64_t> send_rows;     ///< [P] rows to each ep rank (Σ over its experts of my counts)
  std::vector<int64_t> recv_rows;     ///< [P] rows from each ep rank
  std::vector<int64_t> local_counts;  ///< [L] rows per local expert after the exchange
  std::vector<int32_t> perm;          ///< [rows_in] (expert, source) position ← (source, expert) row
  std::vector<int32_t> inv_perm;      ///< [rows_in] the inverse
  int64_t rows_in = 0;                ///< Σ recv_rows
};

/// The exchange from this rank's per-expert counts [E = P·L] and what the other ranks send it,
/// recv_counts [P, L] (row s: source s's counts for this rank's L experts, as an all-to-all of
/// the counts delivers them). Pure host arithmetic. @throws std::invalid_argument when the
/// lengths do not match P or a count is negative.
EpExchange make_ep_exchange(const std::vector<int64_t>& counts, const std::vector<int32_t>& recv_counts, int64_t p);

}  // namespace meshtrain
