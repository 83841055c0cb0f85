#pragma once
/// @file Gradient bookkeeping of tensor parallelism after backward: the replicated parameters
/// whose gradient each tp rank computes in part are summed over tp, and the global gradient
/// norm counts every parameter once whatever its placement.
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

/// Sums over `tp` (in place) the gradients of the shards whose parameter is marked
/// tp_partial_grad (norm weights under sequence parallelism, Qwen3 q/k norms), packed into one
/// all-reduce. Call after GradientSync::finish_gradients(); sums commute, so reducing the fsdp /
/// dp_replicate shards first is the same as reducing over tp first. No-op when tp has one rank.
/// @throws CommError.
void reduce_tp_partial_grads(Device& dev, Communicator& tp, const std::vector<LocalShard>& shards);

/// Elements all-reduced by reduce_tp_partial_grads on this rank (for the byte formulas).
int64_t tp_partial_grad_elems(const std::vector<LocalShard>& shards);

}  // namespace meshtrain
