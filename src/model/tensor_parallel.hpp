#pragma once
/// @file Tensor parallelism as the layers see it (Megatron-LM, Shoeybi et al. 2019; sequence
/// parallelism, Korthikanti et al. 2022): the tp group's context, the two collectives that
/// enter and leave a tensor-parallel region, and the vocab-parallel cross-entropy.
///
/// A column-parallel linear (wq, wk, wv, w1, w3, output) reads the full activation and writes
/// its share of the output features; a row-parallel one (wo, w2) reads that share and writes a
/// partial sum of the full output. Between regions the residual stream is either replicated
/// over tp (sequence parallelism off: tp_enter is the identity, tp_exit an all-reduce, Megatron's
/// f and g operators) or sharded along the tokens (on: the flattened [B·T] rows split into tp
/// contiguous blocks; tp_enter all-gathers them, tp_exit reduce-scatters). Backward uses the
/// same two functions with the roles swapped: the gradient of a region's input is tp_exit of
/// its partial, the gradient reaching a region's output is tp_enter'ed.
#include <cstdint>

#include "comm/communicator.hpp"
#include "device/device.hpp"

namespace meshtrain {

/// The tensor-parallel context of a model replica. With size == 1 every function below is the
/// identity (or the single-rank computation) and comm may be null.
struct TensorParallel {
  Communicator* comm = nullptr;   ///< the tp group (rank order = tp coordinate)
  int64_t size = 1, rank = 0;
  bool sequence_parallel = true;  ///< shard the residual stream and norms along the tokens
  bool loss_parallel = true;      ///< vocab-parallel cross-entropy (false: gather the logits)
  /// Async TP: with sequence parallelism, the blocks' tp_enter + column-parallel matmuls and
  /// row-parallel matmul + tp_exit run as ring steps overlapping transfers with matmuls
  /// (model/async_tensor_parallel.hpp); the embedding and the output head keep tp_enter / tp_exit.
  bool async = false;
  bool active() const { return size > 1; }
};

/// Rows of the residual stream held on each tp rank: N / tp with sequence parallelism, else N
/// (N = B·T tokens of the micro-batch). @throws std::invalid_argument when tp does not divide N.
int64_t tp_local_tokens(const TensorParallel& tp, int64_t tokens);

/// Input of a column-parallel region: x [N/tp, D] all-gathered along the tokens into [N, D]
/// (sequence parallel), or x [N, D] itself. Blocking. @throws CommError.
Tensor tp_enter(Device& dev, const TensorParallel& tp, const Tensor& x);

/// Output of a row-parallel region: this rank's partial sum [N, D] reduced over tp —
/// reduce-scattered along the tokens into [N/tp, D] (sequence parallel) or all-reduced in
/// place ([N, D], returned). Blocking. @throws CommError.
Tensor tp_exit(Device& dev, const TensorParallel& tp, const Tensor& partial);

/// Σ_n CE(n) in nats over logits [N, V_local] whose columns are the vocabulary slice
/// [vocab_start, vocab_start + V_local) of a vocabulary of `vocab_size`, targets i32 [N]
/// (identical on every tp rank). Loss-parallel (Megatron's vocab-parallel cross-entropy): the
/// per-shard (max, Σexp, target logit) triples [N, 3] are all-gathered over tp and combined into
/// the log-sum-exp — the full logits are never gathered; otherwise the logits are all-gathered
/// into [N, V] and the single-rank kernel runs. When dlogits is defined it receives this shard's
/// gradient grad_scale·(softmax − onehot) [N, V_local] (may alias logits). Returns the same
/// value on every tp rank. @throws std::out_of_range for a target outside the vocabulary;
/// CommError.
double tp_cross_entropy(Device& dev, const TensorParallel& tp, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_start, int64_t vocab_size, const Tensor& dlogits, float grad_scale);

/// Shards P of the loss statistics the output head keeps per token: tp.size under the
/// vocab-parallel loss (one (max, Σexp, target logit) triple per vocabulary shard), else 1.
int64_t tp_loss_shards(const TensorParallel& tp);

/// The forward half of tp_cross_entropy for one chunk of rows (chunked cross-entropy, OutputHead):
/// logits [c, V_local] (vocabulary columns [vocab_start, vocab_start + V_local)), targets i32 [c].
/// Writes the chunk's statistics into rows [row0, row0 + c) of stats [P, N, 3] (P =
/// tp_loss_shards; rank order) and lse [c] (f32, nats) = log Σ_v exp(logit) over the whole
/// vocabulary. Once every chunk is in, Device::cross_entropy_combine(stats, lse [N]) returns
/// Σ_n CE in one fixed-order sum over all N rows, so the loss does not depend on the chunking;
/// Device::cross_entropy_grad(logits, targets, vocab_start, lse, ...) gives the gradient from the
/// local logits alone (no second collective). Collective over tp (every rank calls it with the
/// same c and row0). @throws std::out_of_range for a target outside the vocabulary; CommError.
void tp_cross_entropy_stats(Device& dev, const TensorParallel& tp, const Tensor& logits, const Tensor& targets,
                            int64_t vocab_start, int64_t vocab_size, const Tensor& stats, int64_t row0,
                            const Tensor& lse);

}  // namespace meshtrain
