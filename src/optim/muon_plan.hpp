#pragma once
/// @file Who orthogonalizes which matrix under Muon, and what travels where (DESIGN.md's
/// "communication orchestration" is ours: this is Muon's). Newton–Schulz needs each weight matrix
/// whole, but under FSDP / ZeRO a rank holds only dim-0 rows of its tp-local tensor, and under
/// tensor parallelism only a slab. Each matrix is therefore dealt to one owner (s, t) of its
/// shard group (size S, the fsdp or efsdp ranks; S = 1 when parameters are replicated) × the tp
/// group (size T), and per step:
///   1. every rank sends its rows of each matrix to the matrix's shard owner s (one uneven
///      all-to-all over the shard group), which then holds the tp-local matrix;
///   2. the shard owners of a tp-split matrix send their slabs to the tp owner t (one all-to-all
///      over tp), which assembles the global matrix;
///   3. the owner orthogonalizes it;
///   4. steps 2 and 1 run backwards: slabs (or, for a matrix replicated over tp, the whole
///      result) go back over tp, rows back over the shard group.
/// Owners are dealt greedily in model order to the least-loaded (s, t) by Newton–Schulz flops
/// (newton_schulz_flops); a matrix that one shard rank already holds whole (an expert under
/// efsdp) stays with that rank, so it moves nothing in steps 1 and 4. Ranks holding the same
/// replica (dp_replicate) repeat the same work, which keeps replicas bitwise identical.
/// Every rank computes the whole plan from shapes alone (no communication), identically.
/// Per rank and step the bytes sent (f32, 4 bytes per element) are: in step 1 its rows of the
/// matrices owned elsewhere; in step 4 the results for the other ranks' rows of the matrices it
/// owns; over tp the slabs (a tp-replicated matrix whole, back only). perf/comm_volume.py checks
/// the exact formula against the counters.
#include <cstdint>
#include <vector>

#include "model/parameter.hpp"

namespace meshtrain {

/// One matrix Muon orthogonalizes: a 2-D weight, or one expert of an expert-stacked [E, a, b]
/// weight. Shapes in elements; "tp-local" is the tensor on this rank before FSDP sharding.
struct MuonMatrix {
  size_t shard = 0;        ///< index of the local shard (GradientSync::local_shards()) holding it
  int group = 0;           ///< shard group index (MuonGroupInfo)
  int64_t rows = 0, cols = 0;  ///< global [rows, cols] (rows = output features)
  int tp_split = -1;       ///< -1 replicated over tp; 0 rows split; 1 columns split
  /// Where it starts in the tp-local tensor (elements), for tp rank t: offset(t). For a 2-D
  /// weight 0; for expert e of [E_local, a, b] e·a·b (its slab extents do not depend on t).
  int64_t expert = -1;     ///< expert index in the tp-local tensor, or -1
  int s_owner = 0, t_owner = 0;
  /// Extents of tp rank t's slab, [local_rows(t), local_cols(t)].
  int64_t local_rows(int64_t t, int64_t tp) const;
  int64_t local_cols(int64_t t, int64_t tp) const;
  /// First global row (tp_split 0) or column (tp_split 1) of tp rank t's slab; 0 otherwise.
  int64_t slab_first(int64_t t, int64_t tp) const;
  int64_t local_elems(int64_t t, int64_t tp) const { return local_rows(t, tp) * local_cols(t, tp); }
  int64_t offset(int64_t t, int64_t tp) const { return expert < 0 ? 0 : expert * local_elems(t, tp); }
};

/// A shard group: S ranks each holding dim-0 rows of the tp-local tensors (parallel/fsdp/
/// dim0_shard.hpp); S = 1 for replicated parameters.
struct MuonGroupInfo {
  int64_t size = 1;
  int64_t rank = 0;
};

/// Whether Muon orthogonalizes `p`: every weight of 2 or more dimensions except the token
/// embedding and the output head (Jordan et al. 2024; Moonlight, Liu et al. 2025, keep those on
/// AdamW), i.e. attention q/k/v/o, the FFN and shared-expert w1/w2/w3, the router, and each
/// routed expert. Norms (1-D) stay on AdamW. Works on catalog entries (name and shape).
bool muon_orthogonalizes(const Parameter& p);

/// The matrices of the Muon shards, in model order (experts in index order), with owners dealt
/// (see the file comment). `params[i]` is local shard i's parameter (nullptr: not Muon) and
/// `group_of[i]` its shard group index into `groups`; tp is the tp degree. Every rank of a
/// shard × tp group gets the same owners. @throws std::invalid_argument on a parameter whose
/// tp split or expert layout Muon cannot orthogonalize (tp_dim beyond the matrix dims).
std::vector<MuonMatrix> plan_muon_matrices(const std::vector<const Parameter*>& params, const std::vector<int>& group_of,
                                           const std::vector<MuonGroupInfo>& groups, int64_t tp, int ns_steps);

/// The elements [first, first + count) of a tp-local tensor of `local_shape` that shard rank k
/// of S holds (dim-0 rows, dim0_shard).
struct ElemRange {
  int64_t first = 0, count = 0;
};
ElemRange shard_elements(const Shape& local_shape, int64_t group, int64_t k);

/// Intersection of [a.first, a.first + a.count) and [b.first, b.first + b.count).
ElemRange intersect(ElemRange a, ElemRange b);

}  // namespace meshtrain
