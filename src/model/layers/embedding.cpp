#include "model/layers/embedding.hpp"

#include <cmath>

#include "model/layers/primitives.hpp"

namespace meshtrain {

Embedding::Embedding(const ModelArgs& a) {
  // TorchTitan initializes the embedding with N(0, 1); when tied to the output projection the
  // output's init (std D^-1/2) is used instead so initial logits stay O(1).
  const double std = a.tie_word_embeddings ? 1.0 / std::sqrt(double(a.dim)) : 1.0;
  weight = make_parameter("tok_embeddings.weight", {a.vocab_size, a.dim}, InitSpec{InitSpec::Kind::kTruncNormal, std, 3.0}, false);
}

Tensor Embedding::forward(StepContext& ctx, SavedTensors&, const Tensor&) {
  Tensor out = ctx.dev->empty({ctx.tokens.numel(), weight.value.dim(1)}, DType::kF32, MemCategory::kActivations);
  ctx.dev->embedding_forward(weight.value, ctx.tokens, out);
  return out;
}

Tensor Embedding::backward(StepContext& ctx, SavedTensors&, const Tensor& dout) {
  ctx.dev->embedding_backward(dout, ctx.tokens, weight.grad);
  return Tensor();
}

OutputHead::OutputHead(const ModelArgs& a, Parameter* tied_embedding)
    : tied_(a.tie_word_embeddings ? tied_embedding : nullptr), eps_(float(a.norm_eps)) {
  norm = make_parameter("norm.weight", {a.dim}, InitSpec{InitSpec::Kind::kOnes, 0, 0}, false);
  if (!tied_)
    output = make_parameter("output.weight", {a.vocab_size, a.dim}, InitSpec{InitSpec::Kind::kTruncNormal, 1.0 / std::sqrt(double(a.dim)), 3.0});
}

std::vector<Parameter*> OutputHead::parameters() {
  if (tied_) return {&norm};
  return {&norm, &output};
}

Tensor OutputHead::forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) {
  Device& dev = *ctx.dev;
  Tensor h = rmsnorm_forward(dev, saved, x, norm, eps_);
  Tensor logits = linear_forward(dev, h, out_weight());
  Tensor dlogits;
  if (ctx.need_backward) dlogits = logits;  // gradient overwrites the logits in place: one [N, V] buffer
  ctx.loss_sum += dev.cross_entropy(logits, ctx.targets, dlogits, ctx.loss_grad_scale);
  ctx.num_targets += ctx.targets.numel();
  saved.push(h);
  saved.push(dlogits);
  return Tensor();
}

Tensor OutputHead::backward(StepContext& ctx, SavedTensors& saved, const Tensor&) {
  Device& dev = *ctx.dev;
  Tensor dlogits = saved.pop(), h = saved.pop();
  Tensor dh = linear_backward(dev, dlogits, h, out_weight());
  return rmsnorm_backward(dev, saved, dh, norm);
}

}  // namespace meshtrain
