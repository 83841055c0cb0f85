#pragma once
/// @file Gradient bookkeeping of tensor parallelism after backward: the replicated parameters
/// whose gradient each tp rank computes in part are summed over tp, and the global gradient
/// norm counts every parameter once whatever its placement.
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

/// Largest packing buffer of reduce_tp_partial_grads, elements (64 MiB of floats).
constexpr int64_t kTpGradChunkElems = int64_t(16) << 20;

/// Sums over `tp` (in place) the gradients of the shards whose parameter is marked
/// tp_partial_grad (norm weights under sequence parallelism, Qwen3 q/k norms, and under
/// sequence parallelism a MoE block's router and routed experts). Small shards are packed into
/// all-reduces of at most kTpGradChunkElems elements (one, for a dense model's norms); a shard
/// larger than that is all-reduced where it lies, so no buffer grows with the experts. Call
/// after GradientSync::finish_gradients(); sums commute, so reducing the fsdp / dp_replicate
/// shards first is the same as reducing over tp first. No-op when tp has one rank.
/// @throws CommError.
/// `chunk_elems`: the packing buffer's cap (tests use small ones).
void reduce_tp_partial_grads(Device& dev, Communicator& tp, const std::vector<LocalShard>& shards,
                             int64_t chunk_elems = kTpGradChunkElems);

/// Elements all-reduced by reduce_tp_partial_grads on this rank (for the byte formulas).
int64_t tp_partial_grad_elems(const std::vector<LocalShard>& shards);

}  // namespace meshtrain
