#include "model/layers/primitives.hpp"

namespace meshtrain {

Tensor linear_forward(Device& dev, const Tensor& x, const Parameter& w, MemCategory cat) {
  Tensor y = dev.empty({x.dim(0), w.value.dim(0)}, DType::kF32, cat);
  dev.matmul(x, false, w.value, true, y, 1.0f, 0.0f);
  return y;
}

Tensor linear_backward(Device& dev, const Tensor& dy, const Tensor& x, const Parameter& w,
                       const Tensor* accumulate_dx) {
  dev.matmul(dy, true, x, false, w.grad, 1.0f, 1.0f);
  if (accumulate_dx) {
    dev.matmul(dy, false, w.value, false, *accumulate_dx, 1.0f, 1.0f);
    return *accumulate_dx;
  }
  Tensor dx = dev.empty({dy.dim(0), w.value.dim(1)}, DType::kF32, MemCategory::kActivations);
  dev.matmul(dy, false, w.value, false, dx, 1.0f, 0.0f);
  return dx;
}

Tensor rmsnorm_forward(Device& dev, SavedTensors& saved, const Tensor& x, const Parameter& w, float eps) {
  const int64_t d = x.dim(-1), n = x.numel() / d;
  Tensor y = dev.empty(x.shape(), DType::kF32, MemCategory::kActivations);
  Tensor rstd = dev.empty({n}, DType::kF32, MemCategory::kActivations);
  dev.rmsnorm_forward(x, w.value, eps, y, rstd);
  saved.push(x);
  saved.push(rstd);
  return y;
}

Tensor rmsnorm_backward(Device& dev, SavedTensors& saved, const Tensor& dy, const Parameter& w) {
  Tensor rstd = saved.pop();
  Tensor x = saved.pop();
  Tensor dx = dev.empty(x.shape(), DType::kF32, MemCategory::kActivations);
  dev.rmsnorm_backward(dy, x, w.value, rstd, dx, w.grad);
  return dx;
}

}  // namespace meshtrain
