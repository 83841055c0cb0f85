#include "model/layers/feed_forward.hpp"

#include <cmath>
#include <utility>

#include "model/async_tensor_parallel.hpp"
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
  // Under async TP w1 and w3 run inside the fused all-gather; still two kMatmul operators.
  const AllGatherMatmul entry = tp_region_enter(ctx, x_local, {&w1, &w3});
  const Tensor& x = entry.gathered;
  auto linear = [&](size_t i, const Parameter& w) {
    return [&, i, wp = &w] { return entry.outs.empty() ? linear_forward(dev, x, *wp) : entry.outs[i]; };
  };
  Tensor a = saved.op(SacOp::kMatmul, dev, linear(0, w1), false);
  Tensor b = saved.op(SacOp::kMatmul, dev, linear(1, w3), false);
  Tensor h = dev.empty(a.shape(), a.dtype(), MemCategory::kActivations);
  dev.swiglu_forward(a, b, h);
  for (const Tensor& t : {x, a, b, h}) saved.push(t);
  return tp_region_exit(ctx, saved, h, w2);
}

Tensor FeedForward::backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout_local) {
  Device& dev = *ctx.dev;
  Tensor h = saved.pop(), b = saved.pop(), a = saved.pop(), x = saved.pop();
  Tensor dh = tp_region_exit_backward(ctx, dout_local, h, w2);
  Tensor da = dev.empty(a.shape(), dh.dtype(), MemCategory::kActivations);
  Tensor db = dev.empty(b.shape(), dh.dtype(), MemCategory::kActivations);
  dev.swiglu_backward(dh, a, b, da, db);
  return tp_region_enter_backward(ctx, {da, db}, x, {&w1, &w3});
}

}  // namespace meshtrain
