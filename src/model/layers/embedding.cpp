#include "model/layers/embedding.hpp"

#include <cmath>

#include "model/layers/primitives.hpp"
#include "model/weight_grad_queue.hpp"

namespace meshtrain {

Embedding::Embedding(const ModelArgs& a, const TensorParallel& tp) : vocab_size_(a.vocab_size) {
  // TorchTitan initializes the embedding with N(0, 1); when tied to the output projection the
  // output's init (std D^-1/2) is used instead so initial logits stay O(1).
  const double std = a.tie_word_embeddings ? 1.0 / std::sqrt(double(a.dim)) : 1.0;
  weight = make_parameter("tok_embeddings.weight", {a.vocab_size, a.dim}, InitSpec{InitSpec::Kind::kTruncNormal, std, 3.0}, false);
  split_tensor_parallel(weight, 0, tp.size, tp.rank);
}

Tensor Embedding::forward(StepContext& ctx, SavedTensors&, const Tensor&) {
  const Tensor& w = weight.compute_value();
  Tensor out = ctx.dev->empty({ctx.tokens.numel(), w.dim(1)}, ctx.act_dtype, MemCategory::kActivations);
  ctx.dev->embedding_forward(w, ctx.tokens, out, weight.sharding.tp_first, vocab_size_);
  return tp_exit(*ctx.dev, ctx.tp, out);
}

Tensor Embedding::backward(StepContext& ctx, SavedTensors&, const Tensor& dout) {
  // The all-gather (a collective every tp rank joins in order) stays here; only the
  // scatter-add into the weight gradient may be deferred.
  const Tensor grad_out = tp_enter(*ctx.dev, ctx.tp, dout);
  if (ctx.defer_weight_grads)
    ctx.defer_weight_grads->embedding(grad_out, ctx.tokens, weight, weight.sharding.tp_first);
  else
    ctx.dev->embedding_backward(grad_out, ctx.tokens, weight.grad, weight.sharding.tp_first);
  return Tensor();
}

OutputHead::OutputHead(const ModelArgs& a, Parameter* tied_embedding, const TensorParallel& tp)
    : tied_(a.tie_word_embeddings ? tied_embedding : nullptr), eps_(float(a.norm_eps)), vocab_size_(a.vocab_size) {
  norm = make_parameter("norm.weight", {a.dim}, InitSpec{InitSpec::Kind::kOnes, 0, 0}, false);
  norm.sharding.tp_partial_grad = tp.active() && tp.sequence_parallel;
  const InitSpec init{InitSpec::Kind::kTruncNormal, 1.0 / std::sqrt(double(a.dim)), 3.0};
  if (a.tie_word_embeddings && !tied_) {
    // A pipeline stage without the embedding: its own copy of the shared weight, with the
    // embedding's name, init and (no) weight decay, so it starts equal and stays equal.
    output = make_parameter("tok_embeddings.weight", {a.vocab_size, a.dim}, init, false);
    output.sharding.tied_copy = true;
    split_tensor_parallel(output, 0, tp.size, tp.rank);
  } else if (!tied_) {
    output = make_parameter("output.weight", {a.vocab_size, a.dim}, init);
    split_tensor_parallel(output, 0, tp.size, tp.rank);
  }
}

std::vector<Parameter*> OutputHead::parameters() {
  if (tied_) return {&norm};
  return {&norm, &output};
}

Tensor OutputHead::forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) {
  Device& dev = *ctx.dev;
  Tensor h = tp_enter(dev, ctx.tp, rmsnorm_forward(dev, saved, x, norm, eps_));
  Parameter& w = out_weight();
  Tensor logits = linear_forward(dev, h, w);
  Tensor dlogits;
  if (ctx.need_backward) dlogits = logits;  // gradient overwrites the logits in place: one [N, V] buffer
  ctx.loss_sum += tp_cross_entropy(dev, ctx.tp, logits, ctx.targets, w.sharding.tp_first, vocab_size_, dlogits,
                                   ctx.loss_grad_scale);
  ctx.num_targets += ctx.targets.numel();
  saved.push(h);
  saved.push(dlogits);
  return Tensor();
}

Tensor OutputHead::backward(StepContext& ctx, SavedTensors& saved, const Tensor&) {
  Device& dev = *ctx.dev;
  Tensor dlogits = saved.pop(), h = saved.pop();
  // dlogits is the logits buffer the loss overwrote with its gradient in forward.
  Tensor dh = tp_exit(dev, ctx.tp, linear_backward(ctx, dlogits, h, out_weight()));
  return rmsnorm_backward(ctx, saved, dh, norm);
}

}  // namespace meshtrain
