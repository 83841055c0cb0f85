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
/// tied weight is the same local tensor) and the loss vocab-parallel (tp_cross_entropy).
class OutputHead final : public Layer {
 public:
  OutputHead(const ModelArgs& args, Parameter* tied_embedding, const TensorParallel& tp);
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;
  Parameter norm, output;

 private:
  Parameter& out_weight() { return tied_ ? *tied_ : output; }
  std::string name_ = "output";
  Parameter* tied_;
  float eps_;
  int64_t vocab_size_;
};

}  // namespace meshtrain
