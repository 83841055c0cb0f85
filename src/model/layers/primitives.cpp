#include "model/layers/primitives.hpp"

#include <stdexcept>

#include "model/weight_grad_queue.hpp"

namespace meshtrain {

Tensor linear_forward(Device& dev, const Tensor& x, const Parameter& w, MemCategory cat) {
  const Tensor& wc = w.compute_value();
  Tensor y = dev.empty({x.dim(0), wc.dim(0)}, x.dtype(), cat);
  dev.matmul(x, false, wc, true, y, 1.0f, 0.0f);
  return y;
}

Tensor linear_backward(const StepContext& ctx, const Tensor& dy, const Tensor& x, const Parameter& w,
                       const Tensor* accumulate_dx) {
  Device& dev = *ctx.dev;
  const Tensor& wc = w.compute_value();
  if (ctx.defer_weight_grads)
    ctx.defer_weight_grads->linear(dy, x, w);
  else
    dev.matmul(dy, true, x, false, w.grad, 1.0f, 1.0f);
  if (accumulate_dx) {
    dev.matmul(dy, false, wc, false, *accumulate_dx, 1.0f, 1.0f);
    return *accumulate_dx;
  }
  Tensor dx = dev.empty({dy.dim(0), wc.dim(1)}, dy.dtype(), MemCategory::kActivations);
  dev.matmul(dy, false, wc, false, dx, 1.0f, 0.0f);
  return dx;
}

Tensor tp_exit_kept(Device& dev, SavedTensors& saved, const TensorParallel& tp, const Tensor& partial) {
  if (!tp.active() || !tp.sequence_parallel) return tp_exit(dev, tp, partial);
  // The block's residual add writes the shard in place: a kept shard is stashed as a copy.
  return saved.op(SacOp::kCollective, dev, [&] { return tp_exit(dev, tp, partial); }, true);
}

Tensor rmsnorm_forward(Device& dev, SavedTensors& saved, const Tensor& x, const Parameter& w, float eps) {
  const int64_t d = x.dim(-1), n = x.numel() / d;
  Tensor y = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  Tensor rstd = dev.empty({n}, DType::kF32, MemCategory::kActivations);
  dev.rmsnorm_forward(x, w.compute_value(), eps, y, rstd);
  saved.push(x);
  saved.push(rstd);
  return y;
}

namespace {
// The weight gradient the fused RMSNorm kernels accumulate into: w.grad, or nothing (an
// undefined tensor) when the term is deferred — recorded here with the operands it reads.
// An unbound w.grad must not reach the kernels, which would take it for "deferred".
Tensor norm_weight_grad(const StepContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                        const Parameter& w) {
  if (!ctx.defer_weight_grads) {
    if (!w.grad.defined()) throw std::logic_error("rmsnorm backward: " + w.name + " has no gradient bound");
    return w.grad;
  }
  ctx.defer_weight_grads->rmsnorm(dy, x, rstd, w);
  return Tensor();
}
}  // namespace

Tensor rmsnorm_backward(const StepContext& ctx, SavedTensors& saved, const Tensor& dy, const Parameter& w) {
  Device& dev = *ctx.dev;
  Tensor rstd = saved.pop();
  Tensor x = saved.pop();
  Tensor dx = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  dev.rmsnorm_backward(dy, x, w.compute_value(), rstd, dx, norm_weight_grad(ctx, dy, x, rstd, w));
  return dx;
}

Tensor add_rmsnorm_forward(Device& dev, SavedTensors& saved, const Tensor& h, const Tensor& delta, const Parameter& w,
                           float eps) {
  const int64_t n = h.numel() / h.dim(-1);
  Tensor y = dev.empty(h.shape(), h.dtype(), MemCategory::kActivations);
  Tensor rstd = dev.empty({n}, DType::kF32, MemCategory::kActivations);
  dev.add_rmsnorm_forward(h, delta, w.compute_value(), eps, y, rstd);
  saved.push(h);
  saved.push(rstd);
  return y;
}

Tensor rmsnorm_backward_residual(const StepContext& ctx, SavedTensors& saved, const Tensor& dy, const Parameter& w,
                                 const Tensor& residual) {
  Device& dev = *ctx.dev;
  Tensor rstd = saved.pop();
  Tensor x = saved.pop();
  Tensor dx = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  dev.rmsnorm_backward_residual(dy, x, w.compute_value(), rstd, residual, dx, norm_weight_grad(ctx, dy, x, rstd, w));
  return dx;
}

}  // namespace meshtrain
