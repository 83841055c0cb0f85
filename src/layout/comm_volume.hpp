#pragma once
/// @file Bytes each mesh dimension moves per optimizer step per rank for a deck's model — the
/// ring-algorithm volumes (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms";
/// the NCCL performance notes use the same bus-bandwidth factors):
/// all-reduce 2·S·(N−1)/N, all-gather and reduce-scatter S·(N−1)/N for a tensor of S bytes over
/// N ranks. Shown in the layout report so a user sees which traffic crosses the spine.
#include <array>
#include <string>

#include "config/job_config.hpp"
#include "layout/rank_layout.hpp"

namespace meshtrain {

/// Estimated bytes sent per rank per optimizer step, by dimension (index MeshDim); 0 where the
/// dimension has one rank. Terms (P = parameters, L = layers, b = local batch, s = seq_len,
/// h = dim, a = gradient-accumulation steps, B_p / B_r = parameter / reduce dtype bytes):
/// - fsdp (dp_shard × cp, N ranks): per micro-batch an all-gather of the stage's parameters
///   before forward and again before backward (reshard after forward) and a reduce-scatter of
///   gradients: a·(2·B_p + B_r)·P/(tp·pp)·(N−1)/N.
/// - dp_replicate (R ranks): one all-reduce per step of the gradients this rank holds,
///   2·B_r·P/(tp·pp·fsdp)·(R−1)/R (DDP when fsdp = 1, HSDP otherwise).
/// - tp (T ranks): 2 reductions of b·(s/cp)·h activations in forward and 2 in backward per layer
///   (or their all-gather / reduce-scatter halves under sequence parallelism, the same bytes),
///   one each for the embedding and the output head (pp = 1; one on a boundary stage otherwise),
///   2 more per block recomputed by activation checkpointing (C blocks):
///   a·(4·L/pp + 2 + 2·C)·2·(T−1)/T·b·(s/cp)·h·B_p (the loss's 3 floats per token are omitted;
///   perf/comm_volume.py has the exact counts).
/// - pp: each micro-batch's activations sent forward and their gradients backward,
///   a·2·b·(s/cp)·h·B_p (an interior stage; the first and last send half).
/// - cp (C ranks, ring attention): K and V blocks travel the ring in forward (C−1 hops) and K, V
///   and their gradients in backward: a·3·(L/pp)·(C−1)·2·b·(s/cp)·Hkv·Dh·B_p.
std::array<double, kNumMeshDims> comm_bytes_per_step(const JobConfig& cfg, const ParallelDims& dims);

/// The layout report (layout_report) with a bytes-per-step column from comm_bytes_per_step.
std::string layout_report_with_volume(const RankLayout& layout, const JobConfig& cfg);

}  // namespace meshtrain
