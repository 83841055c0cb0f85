// CPU kernels: SwiGLU and the fused cross-entropy forward + backward.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

void CpuDevice::swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t n = a.numel();
  const float *ap = a.f32(), *bp = b.f32();
  float* yp = y.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = ap[i];
    yp[i] = x / (1.0f + std::exp(-x)) * bp[i];
  }
}

void CpuDevice::swiglu_backward(const Tensor& dy, const Tensor& a, const Tensor& b, const Tensor& da,
                                const Tensor& db) {
  const int64_t n = a.numel();
  const float *g = dy.f32(), *ap = a.f32(), *bp = b.f32();
  float *dap = da.f32(), *dbp = db.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = ap[i];
    const float sig = 1.0f / (1.0f + std::exp(-x));
    const float silu = x * sig;
    dbp[i] = g[i] * silu;
    dap[i] = g[i] * bp[i] * sig * (1.0f + x * (1.0f - sig));  // d silu / dx = σ(x)(1 + x(1 − σ(x)))
  }
}

double CpuDevice::cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                                float grad_scale) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  const float* lp = logits.f32();
  const int32_t* tp = targets.i32();
  float* dp = dlogits.defined() ? dlogits.f32() : nullptr;
  for (int64_t i = 0; i < n; ++i)
    if (tp[i] < 0 || tp[i] >= v)
      throw std::out_of_range("target id " + std::to_string(tp[i]) + " outside vocab " + std::to_string(v));
  std::vector<double> row_loss(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = lp + i * v;
    float mx = x[0];
    for (int64_t j = 1; j < v; ++j) mx = std::max(mx, x[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) sum += std::exp(x[j] - mx);
    const float lse = mx + std::log(sum);
    row_loss[i] = double(lse) - double(x[tp[i]]);
    if (dp) {
      float* g = dp + i * v;
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) g[j] = grad_scale * std::exp(x[j] - lse);
      g[tp[i]] -= grad_scale;
    }
  }
  return deterministic_sum(row_loss.data(), n);
}

}  // namespace meshtrain
