#pragma once
/// @file Causal grouped-query attention across the cp group: each rank holds the queries, keys
/// and values of its own chunks of the sequence (context_parallel.hpp) and computes the output
/// of its queries over the whole sequence. Three ways to cross the group
/// ([parallelism] context_parallel_rotate_method):
///
///  - allgather (the Llama 3 paper's choice, TorchTitan's default): K and V of every rank are
///    all-gathered once, packed in one buffer; the local query chunks attend each gathered key
///    chunk the causal mask allows. Backward gathers K/V again (they are not kept: that would
///    hold the whole sequence's K/V per layer), accumulates dK/dV for every gathered chunk and
///    reduce-scatters them back to their owners (sum, f32).
///  - alltoall, a true ring (Liu et al. 2023, Ring Attention): at step s rank r holds the K/V
///    of rank r − s; it posts the send of that buffer to r + 1 and the receive of the next from
///    r − 1, computes its blocks, then waits. cp − 1 hops. Backward runs the same ring; the
///    dK/dV of the block a rank holds travel behind it (f32): at step s ≥ 1 each rank adds its
///    share to the partial sum received from r − 1, which arrived while it computed, and sends
///    the sum on; after cp − 1 hops every partial sum reaches the owner of its K/V, which adds
///    the share it computed at step 0 (the volume of a reduce-scatter).
///  - ulysses (Jacobs et al. 2023, DeepSpeed-Ulysses): all-to-all from sequence shards to head
///    shards (each rank: the whole sequence, Hq / cp query and Hkv / cp kv heads), the
///    single-rank causal kernel, and the all-to-all back; backward the same with the gradients.
///
/// Blocks (ring and allgather) are exact: a local query chunk with global index g attends key
/// chunk h < g whole (AttentionMask::kNone) and chunk g with a causal diagonal; h > g is
/// skipped. Partial outputs merge in f32 with the log-sum-exp rule (Device::attention_merge);
/// backward recomputes each block with the merged log-sum-exp, so each block's probabilities are
/// the global ones, and dQ stays local. Under head-tail balancing each rank's blocks are 2·cp + 1
/// chunk pairs, half of them diagonal or whole, so the ring's steps are equal work.
///
/// Shapes: a rank's tokens are chunk-major (context_parallel.hpp); q [chunks·B, C, Hq, Dh],
/// k, v [chunks·B, C, Hkv, Dh] in the activation dtype, after RoPE with global positions.
/// Buffer lifetimes: the gathered K/V (allgather), the two ring buffers and the head-sharded
/// copies (ulysses) live for one call, under MemCategory::kCommunication; the tensors returned in
/// `saved` (kActivations) are what a layer keeps until backward.
#include <vector>

#include "device/device.hpp"
#include "parallel/context/context_parallel.hpp"

namespace meshtrain {

/// Forward's output and what backward needs, in the order backward takes it.
struct CpAttentionForward {
  Tensor out;                ///< [chunks·B, C, Hq, Dh], activation dtype
  std::vector<Tensor> saved; ///< opaque; pass to cp_attention_backward unchanged
};

/// Attention of this rank's queries over the whole causal sequence (see the file comment).
/// batch = B; scale = 1/sqrt(Dh). Blocking (collectives complete before it returns).
/// docs (default none): document masking with the whole sample's table (offsets 0; the same
/// table on every cp rank, so both sides of a chunk pair know its documents): each block reads
/// it at its chunks' global positions, and with docs.host_starts a key chunk that ends before
/// the document of its query chunk's first token (for every sample) is skipped whole, forward
/// and backward. Ulysses passes it to the single-rank kernel, whose sequence is in global order.
/// @throws std::invalid_argument on shapes that do not match the shard (or Hq, Hkv not divisible
/// by cp under ulysses); CommError.
CpAttentionForward cp_attention_forward(Device& dev, const ContextParallel& cp, const SequenceShard& shard,
                                        int64_t batch, const Tensor& q, const Tensor& k, const Tensor& v,
                                        float scale, const DocumentMask& docs = {});

/// Gradients of cp_attention_forward's inputs, in the activation dtype and q's / k's shapes.
struct CpAttentionGrads {
  Tensor dq, dk, dv;
};

/// dout like forward's out; docs as given to forward. Blocking.
/// @throws std::invalid_argument on shapes; CommError.
CpAttentionGrads cp_attention_backward(Device& dev, const ContextParallel& cp, const SequenceShard& shard,
                                       int64_t batch, const std::vector<Tensor>& saved, const Tensor& dout,
                                       float scale, const DocumentMask& docs = {});

}  // namespace meshtrain
