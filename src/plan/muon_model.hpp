#pragma once
/// @file What the Muon optimizer (`[optimizer] name = "Muon"`, optim/muon.hpp) costs the
/// planner: which weights it orthogonalizes and the Newton–Schulz work of each.
///
/// Muon keeps one float32 momentum buffer (4 bytes per element) for every 2-D hidden weight
/// matrix — attention wq, wk, wv, wo; the dense FFN's w1, w2, w3; in a MoE block the router and
/// every expert's w1, w2, w3 (orthogonalized per expert) and the shared experts' — and AdamW's
/// two moments (8 bytes per element) for the rest: embeddings, output head, norms. Each step,
/// every matrix is gathered whole (float32) to one owner rank of its FSDP-shard × tp group,
/// orthogonalized there by `muon_num_ns_steps` Newton–Schulz iterations, and the update is
/// scattered back. For an m × n matrix (m ≤ n) one iteration forms A = X·Xᵀ (2·m²·n FLOPs),
/// B = b·A + c·A·A (2·m³) and X ← a·X + B·X (2·m²·n): 4·m²·n + 2·m³ FLOPs (Jordan et al. 2024's
/// quintic iteration).
#include <cstdint>
#include <vector>

#include "config/job_config.hpp"

namespace meshtrain {

/// One weight shape Muon orthogonalizes, whole (not sharded over tp or FSDP): `count` matrices
/// of rows × cols (count > 1 for a MoE block's experts, orthogonalized one by one).
struct MuonMatrix {
  int64_t rows = 0, cols = 0, count = 1;
};

/// The Muon matrices of block `block` of `args`: wq [Hq·Dh, D], wk and wv [Hkv·Dh, D],
/// wo [D, Hq·Dh]; a dense block's w1 and w3 [F, D] and w2 [D, F]; a MoE block's router [E, D],
/// E experts' w1 and w3 [H, D] and w2 [D, H] (H = moe_inter_dim), and the shared experts' FFN of
/// width num_shared_experts·H. Throws nothing.
std::vector<MuonMatrix> muon_matrices(const ModelArgs& args, int64_t block);

/// Newton–Schulz FLOPs of `steps` iterations on one rows × cols matrix:
/// steps · (4·m²·n + 2·m³), m = min(rows, cols), n = max. Throws nothing.
double newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps);

/// The float32 elements the owner holds while orthogonalizing one rows × cols matrix: the
/// gathered matrix, X and the next X (3·m·n) and A, A·A and B (3·m²). Throws nothing.
int64_t newton_schulz_workspace(int64_t rows, int64_t cols);

/// Whether the deck trains with Muon (`[optimizer] name = "Muon"`). Throws nothing.
bool uses_muon(const JobConfig& cfg);

}  // namespace meshtrain
