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
/// - cp (CP ranks): the bytes this rank sends, as the communicators count them (a send its
///   whole tensor, an all-gather / reduce-scatter / all-to-all (CP−1)/CP of the larger side).
///   Per attention layer and micro-batch the rank's packed K and V are KV = 2·b·(s/cp)·(Hkv/T)·Dh
///   elements (Hq, Hkv query / kv heads, Dh = head_dim, T tp ranks); dK/dV travel as f32 sums
///   (4 bytes); a stage has L/pp blocks, C of them rerunning their forward (as for tp):
///   - allgather: K/V all-gathered in forward, again in backward and in each recomputed
///     forward; dK/dV reduce-scattered back to their owners:
///     a·(CP−1)·KV·((2·L/pp + C)·B_p + (L/pp)·4);
///   - alltoall (ring): CP−1 hops of K/V per forward; backward CP−1 hops of K/V and CP−1 hops
///     of the dK/dV partial sums: a·(CP−1)·KV·((2·L/pp + C)·B_p + (L/pp)·4);
///   - ulysses: all-to-alls of q, k, v and the output in forward, of dout, dq, dk, dv in
///     backward: a·(2·L/pp + C)·2·(CP−1)/CP·b·(s/cp)·((Hq + Hkv)/T)·Dh·B_p.
///   Under pp, a·b is the same samples cut into smaller micro-batches, so the terms stand.
///   perf/comm_volume.py checks them against the counters exactly, for the stage's own blocks.
std::array<double, kNumMeshDims> comm_bytes_per_step(const JobConfig& cfg, const ParallelDims& dims);

/// The layout report (layout_report) with a bytes-per-step column from comm_bytes_per_step.
std::string layout_report_with_volume(const RankLayout& layout, const JobConfig& cfg);

}  // namespace meshtrain
