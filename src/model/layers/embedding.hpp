#pragma once
/// @file Embedding and OutputHead: the first and last units of the graph.
#include "config/model_args.hpp"
#include "model/layer.hpp"

namespace meshtrain {

/// tok_embeddings.weight [V, D]; forward ignores `in` and embeds ctx.tokens → [B·T, D].
class Embedding final : public Layer {
 public:
  explicit Embedding(const ModelArgs& args);
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override { return {&weight}; }
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& in) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;
  Parameter weight;

 private:
  std::string name_ = "tok_embeddings";
};

/// norm.weight [D] and output.weight [V, D] (or the embedding's weight when tied).
/// forward: [B·T, D] → logits → cross-entropy against ctx.targets; returns an empty tensor and
/// adds Σ CE to ctx.loss_sum. With ctx.need_backward, the loss gradient (scaled by
/// ctx.loss_grad_scale) is computed in the same pass and saved, so logits are freed at once.
class OutputHead final : public Layer {
 public:
  OutputHead(const ModelArgs& args, Parameter* tied_embedding);
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
};

}  // namespace meshtrain
