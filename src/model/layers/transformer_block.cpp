#include "model/layers/transformer_block.hpp"

#include "model/layers/primitives.hpp"

namespace meshtrain {

TransformerBlock::TransformerBlock(const ModelArgs& a, int layer_id, const TensorParallel& tp,
                                   const ExpertParallel& ep)
    : name_("layers." + std::to_string(layer_id)),
      layer_id_(layer_id),
      eps_(float(a.norm_eps)),
      attention(a, layer_id, name_ + ".", tp) {
  if (a.is_moe_layer(layer_id)) {
    auto m = std::make_unique<MoE>(a, layer_id, name_ + ".", tp, ep);
    moe_ = m.get();
    ffn_ = std::move(m);
  } else {
    ffn_ = std::make_unique<FeedForward>(a, layer_id, name_ + ".feed_forward", a.ffn_dim(), tp);
  }
  const InitSpec ones{InitSpec::Kind::kOnes, 0, 0};
  attention_norm = make_parameter(name_ + ".attention_norm.weight", {a.dim}, ones, false);
  ffn_norm = make_parameter(name_ + ".ffn_norm.weight", {a.dim}, ones, false);
  for (Parameter* w : {&attention_norm, &ffn_norm}) w->sharding.tp_partial_grad = tp.active() && tp.sequence_parallel;
}

std::vector<Parameter*> TransformerBlock::parameters() {
  std::vector<Parameter*> out{&attention_norm};
  for (Parameter* p : attention.parameters()) out.push_back(p);
  out.push_back(&ffn_norm);
  for (Parameter* p : ffn_->parameters()) out.push_back(p);
  return out;
}

Tensor TransformerBlock::forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) {
  Device& dev = *ctx.dev;
  Tensor h = attention.forward(ctx, saved, rmsnorm_forward(dev, saved, x, attention_norm, eps_));
  // h += x (residual) and ffn_norm(h) in one pass over h.
  Tensor out = ffn_->forward(ctx, saved, add_rmsnorm_forward(dev, saved, h, x, ffn_norm, eps_));
  dev.add(out, h, 1.0f);
  return out;
}

Tensor TransformerBlock::backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) {
  // Each norm's gradient is fused with the residual branch's: dh = dout + ∂ffn_norm·dffn.
  Tensor dh = rmsnorm_backward_residual(ctx, saved, ffn_->backward(ctx, saved, dout), ffn_norm, dout);
  return rmsnorm_backward_residual(ctx, saved, attention.backward(ctx, saved, dh), attention_norm, dh);
}

}  // namespace meshtrain
