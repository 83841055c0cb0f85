#pragma once
/// @file FeedForward: SwiGLU MLP, out = w2(silu(w1·x) ⊙ w3·x) (Shazeer 2020; Llama).
#include "config/model_args.hpp"
#include "model/layer.hpp"

namespace meshtrain {

/// w1, w3 [H, D], w2 [D, H]: H = ModelArgs::ffn_dim() for a dense block, num_shared_experts ·
/// moe_inter_dim for a MoE block's shared experts. forward: [N, D] → [N, D], N per
/// tp_local_tokens. Under tensor parallelism w1, w3 are column-parallel and w2 row-parallel
/// over the hidden units (chunk_range: ⌈H/tp⌉ per rank), one tp_exit each way.
class FeedForward final : public Layer {
 public:
  /// `name` prefixes the weights' names (layers.{i}.feed_forward, layers.{i}.moe.shared_experts);
  /// `hidden` is H. @throws std::invalid_argument when tp leaves a rank no hidden unit.
  FeedForward(const ModelArgs& args, int layer_id, std::string name, int64_t hidden, const TensorParallel& tp);
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override { return {&w1, &w2, &w3}; }
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;

  Parameter w1, w2, w3;

 private:
  std::string name_;
};

}  // namespace meshtrain
