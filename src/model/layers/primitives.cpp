#include "model/layers/primitives.hpp"

namespace meshtrain {

Tensor linear_forward(Device& dev, const Tensor& x, const Parameter& w, MemCategory cat) {
  const Tensor& wc = w.compute_value();
  Tensor y = dev.empty({x.dim(0), wc.dim(0)}, x.dtype(), cat);
  dev.matmul(x, false, wc, true, y, 1.0f, 0.0f);
  return y;
}

Tensor linear_backward(Device& dev, const Tensor& dy, const Tensor& x, const Parameter& w,
                       const Tensor* accumulate_dx) {
  const Tensor& wc = w.compute_value();
  dev.matmul(dy, true, x, false, w.grad, 1.0f, 1.0f);
  if (accumulate_dx) {
    dev.matmul(dy, false, wc, false, *accumulate_dx, 1.0f, 1.0f);
    return *accumulate_dx;
  }
  Tensor dx = dev.empty({dy.dim(0), wc.dim(1)}, dy.dtype(), MemCategory::kActivations);
  dev.matmul(dy, false, wc, false, dx, 1.0f, 0.0f);
  return dx;
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

Tensor rmsnorm_backward(Device& dev, SavedTensors& saved, const Tensor& dy, const Parameter& w) {
  Tensor rstd = saved.pop();
  Tensor x = saved.pop();
  Tensor dx = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  dev.rmsnorm_backward(dy, x, w.compute_value(), rstd, dx, w.grad);
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

Tensor rmsnorm_backward_residual(Device& dev, SavedTensors& saved, const Tensor& dy, const Parameter& w,
                                 const Tensor& residual) {
  Tensor rstd = saved.pop();
  Tensor x = saved.pop();
  Tensor dx = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  dev.rmsnorm_backward_residual(dy, x, w.compute_value(), rstd, residual, dx, w.grad);
  return dx;
}

}  // namespace meshtrain
