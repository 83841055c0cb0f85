#pragma once
/// @file Context parallelism as the layers see it: the cp group, how each sample's sequence is
/// cut over it, and which way attention crosses it.
///
/// Each sample's T tokens are cut into 2·cp chunks of C = T / (2·cp). With head-tail balancing
/// (TorchTitan's "headtail", the zigzag of Llama 3 and of Striped / zigzag ring attention) cp rank
/// i holds chunks i and 2·cp − 1 − i: under a causal mask, chunk g attends g + 1 chunks, so
/// every rank attends (i + 1) + (2·cp − i) = 2·cp + 1 chunk pairs. Without balancing ("none")
/// rank i holds chunks 2i and 2i + 1, and the last rank does the most work.
///
/// A rank's tokens are laid out chunk-major, [chunks, B, C]: row (c·B + b)·C + t of the
/// flattened micro-batch is token t of local chunk c of sample b. Everything per-token (linear
/// layers, norms, the loss, sequence parallelism's row split) is indifferent to the order, and
/// each local chunk of q, k, v is then one contiguous [B, C, H, Dh] tensor, the operand of a
/// block-attention kernel. Positions, for RoPE, are the tokens' global ones.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace meshtrain {

/// [parallelism] context_parallel_rotate_method.
enum class CpRotate {
  kAllGather,  ///< "allgather": K/V all-gathered, local queries attend every chunk before them
  kAllToAll,   ///< "alltoall": a ring; K/V shards pass to the next rank cp − 1 times
  kUlysses,    ///< "ulysses": all-to-all from sequence shards to head shards and back
};

/// [parallelism] context_parallel_load_balancer.
enum class CpBalancer {
  kHeadTail,  ///< "headtail": rank i holds chunks i and 2·cp − 1 − i
  kNone,      ///< "none": rank i holds chunks 2i and 2i + 1
};

/// The deck's names. @throws std::invalid_argument for another name.
CpRotate cp_rotate_from_name(const std::string& name);
CpBalancer cp_balancer_from_name(const std::string& name);
const char* cp_rotate_name(CpRotate r);

/// Time the cp group's transfers took and how much of it a rank spent blocked (seconds,
/// accumulated until the trainer takes them). A transfer's span runs from its post to the first
/// moment its completion is seen: polled between the blocks it overlaps (so the span can exceed
/// the transfer by up to one block) or at the wait, so 1 − wait_s / comm_s is an upper bound on
/// the share of the communication hidden behind computation. Collectives waited for at once
/// (all-gather, all-to-all) count fully in both.
struct CpStats {
  double comm_s = 0;  ///< Σ transfer spans
  double wait_s = 0;  ///< Σ time blocked waiting for them
};

/// The context-parallel context of one rank. With size == 1 the sequence is whole and comm may
/// be null.
struct ContextParallel {
  Communicator* comm = nullptr;  ///< the cp group (rank order = cp coordinate)
  int64_t size = 1, rank = 0;
  CpRotate rotate = CpRotate::kAllGather;
  CpBalancer balancer = CpBalancer::kHeadTail;
  CpStats* stats = nullptr;  ///< where cp_attention accumulates its timings (null: not kept)
  bool active() const { return size > 1; }
};

/// One cp rank's share of a sequence of seq_len tokens: its chunks, in local (chunk-major)
/// order. With cp = 1 it is one chunk, the whole sequence.
struct SequenceShard {
  int64_t seq_len = 0;          ///< T, tokens per sample
  int64_t chunk_len = 0;        ///< C = T / (2·cp), or T when cp = 1
  std::vector<int64_t> chunks;  ///< global chunk index of each local chunk, ascending
  /// Tokens per sample on this rank (T / cp).
  int64_t local_len() const { return chunk_len * int64_t(chunks.size()); }
  /// Global position of token t of local chunk c.
  int64_t position(size_t c, int64_t t) const { return chunks[c] * chunk_len + t; }
};

/// The shard of cp rank `rank` of `cp` under `balancer`.
/// @throws std::invalid_argument unless 0 <= rank < cp and 2·cp divides seq_len (cp > 1).
SequenceShard sequence_shard(int64_t seq_len, int64_t cp, int64_t rank, CpBalancer balancer);
inline SequenceShard sequence_shard(int64_t seq_len, const ContextParallel& cp) {
  return sequence_shard(seq_len, cp.size, cp.rank, cp.balancer);
}

/// Cuts n samples [n, T + 1] (token ids; inputs are [:, :T], targets [:, 1:], so targets are
/// shifted before the sequence is cut) into this shard's inputs and targets, each
/// [chunks, n, C] (chunk-major, local_len()·n values). Throws nothing.
void shard_samples(const SequenceShard& shard, const int32_t* samples, int64_t n, int32_t* inputs, int32_t* targets);

/// The inverse of the cut for one per-token array: every rank's [chunks, n, C] values (rank
/// order, as an all-gather over the cp group returns them) back into [n, T].
/// @throws std::invalid_argument when `all` does not hold cp · n · T / cp values.
std::vector<int32_t> unshard_tokens(const std::vector<int32_t>& all, int64_t n, int64_t seq_len, int64_t cp,
                                    CpBalancer balancer);

}  // namespace meshtrain
