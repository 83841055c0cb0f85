#pragma once
/// @file TransformerBlock: pre-norm decoder block, h = x + attention(attention_norm(x)),
/// out = h + ffn(ffn_norm(h)), where ffn is the dense feed_forward or, in a Mixture-of-Experts
/// block (ModelArgs::is_moe_layer), the MoE layer. One FSDP / activation-checkpointing unit.
#include <memory>

#include "model/layers/attention.hpp"
#include "model/layers/feed_forward.hpp"
#include "model/layers/moe.hpp"

namespace meshtrain {

/// forward: [N, D] → [N, D], N per tp_local_tokens. The norms act on the rows this rank
/// holds; under sequence parallelism those are a token shard, so their gradients are partial.
class TransformerBlock final : public Layer {
 public:
  /// `ep`: the expert-parallel group of a MoE block (ignored by dense blocks).
  TransformerBlock(const ModelArgs& args, int layer_id, const TensorParallel& tp, const ExpertParallel& ep = {});
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;
  int layer_id() const { return layer_id_; }
  /// The block's MoE layer, or nullptr for a dense block.
  MoE* moe() const { return moe_; }

 private:
  std::string name_;
  int layer_id_;
  float eps_;
  Parameter attention_norm, ffn_norm;
  Attention attention;
  std::unique_ptr<Layer> ffn_;  // FeedForward (layers.{i}.feed_forward) or MoE (layers.{i}.moe)
  MoE* moe_ = nullptr;
};

}  // namespace meshtrain
