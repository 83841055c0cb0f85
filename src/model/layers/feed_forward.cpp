#include "model/layers/feed_forward.hpp"

#include <cmath>
#include <utility>

#include "model/layers/primitives.hpp"

namespace meshtrain {

FeedForward::FeedForward(const ModelArgs& a, int layer_id, std::string name, int64_t hidden, const TensorParallel& tp)
    : name_(std::move(name)) {
  const int64_t h = hidden;
  const InitSpec base{InitSpec::Kind::kTruncNormal, 0.02, 2.0};
  const InitSpec depth{InitSpec::Kind::kTruncNormal, 0.02 / std::sqrt(2.0 * (layer_id + 1)), 2.0};
  w1 = make_parameter(name_ + ".w1.weight", {h, a.dim}, base);
  w2 = make_parameter(name_ + ".w2.weight", {a.dim, h}, depth);
  w3 = make_parameter(name_ + ".w3.weight", {h, a.dim}, depth);
  split_tensor_parallel(w1, 0, tp.size, tp.rank);
  split_tensor_parallel(w3, 0, tp.size, tp.rank);
  split_tensor_parallel(w2, 1, tp.size, tp.rank);
}

Tensor FeedForward::forward(StepContext& ctx, SavedTensors& saved, const Tensor& x_local) {
  Device& dev = *ctx.dev;
  const Tensor x = tp_enter(dev, ctx.tp, x_local);
  Tensor a = saved.op(SacOp::kMatmul, dev, [&] { return linear_forward(dev, x, w1); }, false);
  Tensor b = saved.op(SacOp::kMatmul, dev, [&] { return linear_forward(dev, x, w3); }, false);
  Tensor h = dev.empty(a.shape(), a.dtype(), MemCategory::kActivations);
  dev.swiglu_forward(a, b, h);
  // The output is reduced in place (tp) or takes the block's residual add: kept as a copy.
  Tensor out = saved.op(SacOp::kMatmul, dev, [&] { return linear_forward(dev, h, w2); }, true);
  for (const Tensor& t : {x, a, b, h}) saved.push(t);
  return tp_exit_kept(dev, saved, ctx.tp, out);
}

Tensor FeedForward::backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout_local) {
  Device& dev = *ctx.dev;
  const Tensor dout = tp_enter(dev, ctx.tp, dout_local);
  Tensor h = saved.pop(), b = saved.pop(), a = saved.pop(), x = saved.pop();
  Tensor dh = linear_backward(ctx, dout, h, w2);
  Tensor da = dev.empty(a.shape(), dh.dtype(), MemCategory::kActivations);
  Tensor db = dev.empty(b.shape(), dh.dtype(), MemCategory::kActivations);
  dev.swiglu_backward(dh, a, b, da, db);
  Tensor dx = linear_backward(ctx, da, x, w1);
  linear_backward(ctx, db, x, w3, &dx);
  return tp_exit(dev, ctx.tp, dx);
}

}  // namespace meshtrain
