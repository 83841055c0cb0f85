#pragma once
/// @file The "ulysses" rotate method of cp_attention (Jacobs et al. 2023, DeepSpeed-Ulysses):
/// an all-to-all turns this rank's sequence shard of every head into the whole sequence of
/// Hq / cp query and Hkv / cp kv heads (rank j gets heads [j·H/cp, (j+1)·H/cp)), in global token
/// order; the single-rank causal kernel runs on it; an all-to-all turns the output back. Backward
/// sends dout the same way, runs the single-rank backward, and returns dq, dk, dv. Each
/// all-to-all moves (cp − 1) / cp of the tensor. Buffers as in cp_attention.hpp; `saved` holds
/// the head-sharded q, k, v, out and lse ([B, T, H/cp, Dh], [B, Hq/cp, T]).
#include "parallel/context/cp_attention.hpp"

namespace meshtrain {

/// cp_attention_forward for CpRotate::kUlysses (same contract).
/// @throws std::invalid_argument when cp does not divide Hq and Hkv.
CpAttentionForward ulysses_forward(Device& dev, const ContextParallel& cp, const SequenceShard& shard, int64_t batch,
                                   const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                   const DocumentMask& docs = {});

/// cp_attention_backward for CpRotate::kUlysses (same contract).
CpAttentionGrads ulysses_backward(Device& dev, const ContextParallel& cp, const SequenceShard& shard, int64_t batch,
                                  const std::vector<Tensor>& saved, const Tensor& dout, float scale,
                                  const DocumentMask& docs = {});

}  // namespace meshtrain
