#pragma once
/// @file Embedding and OutputHead: the first and last units of the graph.
#include "config/model_args.hpp"
#include "model/layer.hpp"

namespace meshtrain {

/// tok_embeddings.weight [V, D]; forward ignores `in` and embeds ctx.tokens → [N, D] (N per
/// tp_local_tokens). Under tensor parallelism the table is split over the vocabulary (rows,
/// chunk_range): each rank looks up the ids it holds, zeros elsewhere, and tp_exit sums.
class Embedding final : public Layer {
 public:
  Embedding(const ModelArgs& args, const TensorParallel& tp);
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override { return {&weight}; }
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& in) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;
  Parameter weight;

 private:
  std::string name_ = "tok_embeddings";
  int64_t vocab_size_;
};

/// norm.weight [D] and output.weight [V, D] (or the embedding's weight when tied; on a pipeline
/// stage without the embedding, tied_embedding is null and the head holds a copy named
/// tok_embeddings.weight, ShardingSpec::tied_copy).
/// forward: [N, D] → logits → cross-entropy against ctx.targets; returns an empty tensor and
/// adds Σ CE over the micro-batch's B·T targets to ctx.loss_sum (the same on every tp rank).
/// With ctx.need_backward, the loss gradient (scaled by ctx.loss_grad_scale) is computed in
/// the same pass and saved, so logits are freed at once. Under tensor parallelism the output
/// projection is column-parallel over the vocabulary (its slab has the embedding's rows, so a
/// tied weight is the same local tensor) and the loss vocab-parallel (tp_cross_entropy_stats).
///
/// PaLM's z-loss (args.output_z_loss_coeff = ζ, Chowdhery et al. 2022 §5): ζ·lse² per token,
/// lse = log Σ_v exp(logit), enters the gradient (Device::cross_entropy_grad) and is summed into
/// z_loss_sum() in nats, apart from ctx.loss_sum (the reported loss stays the plain CE).
///
/// Chunked cross-entropy (args.loss_chunk_tokens = C > 0, C < N): forward computes the logits
/// [C, V_local] of one chunk of rows at a time and keeps only the statistics (stats [P, N, 3],
/// lse [N]); backward recomputes each chunk's logits, turns them into their gradient in place,
/// accumulates the weight gradient and writes the chunk's rows of d(hidden). The logits buffer
/// is [C, V_local] instead of [N, V_local], for one more head GEMM (2·N·D·V_local FLOPs). Every
/// GEMM runs over row blocks of Device::head_gemm_rows() tokens anchored at token 0, and C is a
/// multiple of it, so on CPU the chunked head runs the very GEMMs of the unchunked one, in the
/// same order: losses and gradients are bitwise equal. Under a split backward (zero-bubble
/// schedules, ctx.defer_weight_grads) a chunked head computes its weight gradient in the B
/// action rather than deferring it, since deferring would keep every chunk's gradient alive.
/// forward / backward @throw std::invalid_argument when loss_chunk_tokens is negative or not a
/// multiple of Device::head_gemm_rows() (validate() refuses such decks first), std::out_of_range
/// for a target outside the vocabulary, CommError under tensor parallelism.
class OutputHead final : public Layer {
 public:
  OutputHead(const ModelArgs& args, Parameter* tied_embedding, const TensorParallel& tp);
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;
  /// ζ·Σ lse² in nats over the tokens of every forward since the last reset (training and
  /// validation alike; the trainer resets it before each step). 0 when the z-loss is off.
  double z_loss_sum() const { return z_loss_sum_; }
  void reset_z_loss_sum() { z_loss_sum_ = 0; }
  Parameter norm, output;

 private:
  Parameter& out_weight() { return tied_ ? *tied_ : output; }
  /// Rows per chunk for a micro-batch of n tokens (n when unchunked).
  int64_t chunk_rows(const Device& dev, int64_t n) const;
  /// logits [c, V_local] = h[r0 : r0 + c] · Wᵀ, one GEMM per head_gemm_rows() block.
  Tensor chunk_logits(Device& dev, const Tensor& h, const Tensor& w, int64_t r0, int64_t c) const;
  /// From a chunk's dlogits [c, V_local]: W.grad += dlogitsᵀ · h[r0 : r0 + c] and dh[r0 : r0 + c]
  /// = dlogits · W, block by block (the weight term deferred when `may_defer` and the context
  /// splits the backward).
  void chunk_backward(const StepContext& ctx, const Tensor& dlogits, const Tensor& h, int64_t r0, const Tensor& dh,
                      bool may_defer);
  std::string name_ = "output";
  Parameter* tied_;
  float eps_;
  int64_t vocab_size_;
  float z_coeff_;
  int64_t chunk_tokens_;
  double z_loss_sum_ = 0;
};

}  // namespace meshtrain
