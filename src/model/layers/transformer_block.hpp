#pragma once
/// @file TransformerBlock: pre-norm decoder block, h = x + attention(attention_norm(x)),
/// out = h + feed_forward(ffn_norm(h)). One FSDP / activation-checkpointing unit.
#include "model/layers/attention.hpp"
#include "model/layers/feed_forward.hpp"

namespace meshtrain {

/// forward: [N, D] → [N, D], N per tp_local_tokens. The norms act on the rows this rank
/// holds; under sequence parallelism those are a token shard, so their gradients are partial.
class TransformerBlock final : public Layer {
 public:
  TransformerBlock(const ModelArgs& args, int layer_id, const TensorParallel& tp);
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;
  int layer_id() const { return layer_id_; }

 private:
  std::string name_;
  int layer_id_;
  float eps_;
  Parameter attention_norm, ffn_norm;
  Attention attention;
  FeedForward feed_forward;
};

}  // namespace meshtrain
