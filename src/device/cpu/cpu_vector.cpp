// CPU kernels on flat tensors: AdamW, reductions, scale / add / copy / fill / cast.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "device/cpu/cpu_device.hpp"
#include "tensor/bf16.hpp"

namespace meshtrain {

namespace {
void same_numel(const Tensor& a, const Tensor& b, const char* what) {
  if (a.numel() != b.numel())
    throw std::invalid_argument(std::string(what) + ": numel " + std::to_string(a.numel()) + " vs " +
                                std::to_string(b.numel()));
}
constexpr int64_t kReduceBlock = 4096;  // fixed block size: sums independent of thread count
}  // namespace

void CpuDevice::adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                      const AdamWParams& p) {
  same_numel(param, grad, "adamw");
  same_numel(param, exp_avg, "adamw");
  same_numel(param, exp_avg_sq, "adamw");
  const int64_t n = param.numel();
  float *w = param.f32(), *m = exp_avg.f32(), *v = exp_avg_sq.f32();
  const float* g = grad.f32();
  const float bc1 = 1.0f - std::pow(p.beta1, float(p.step));
  const float bc2 = 1.0f - std::pow(p.beta2, float(p.step));
  const float step_size = p.lr / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  const float decay = 1.0f - p.lr * p.weight_decay, b1 = p.beta1, b2 = p.beta2, eps = p.eps, gs = p.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

double CpuDevice::sum_squares(const Tensor& x) {
  const int64_t n = x.numel(), nb = (n + kReduceBlock - 1) / kReduceBlock;
  const float* p = x.f32();
  std::vector<double> part(nb);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) {
    double s = 0;
    const int64_t e = std::min(n, (b + 1) * kReduceBlock);
    for (int64_t i = b * kReduceBlock; i < e; ++i) s += double(p[i]) * p[i];
    part[b] = s;
  }
  return deterministic_sum(part.data(), nb);
}

void CpuDevice::scale(const Tensor& x, float alpha) {
  const int64_t n = x.numel();
  float* p = x.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

void CpuDevice::add(const Tensor& y, const Tensor& x, float alpha) {
  same_numel(y, x, "add");
  const int64_t n = y.numel();
  float* yp = y.f32();
  const float* xp = x.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] += alpha * xp[i];
}

void CpuDevice::copy(const Tensor& dst, const Tensor& src) {
  same_numel(dst, src, "copy");
  if (dst.dtype() != src.dtype()) throw std::invalid_argument("copy between dtypes");
  std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuDevice::copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols) {
  const int64_t n = dst.dim(0), cd = dst.dim(1), cs = src.dim(1);
  if (src.dim(0) != n || dst_col < 0 || src_col < 0 || dst_col + cols > cd || src_col + cols > cs)
    throw std::invalid_argument("copy_columns: block outside the matrices");
  const float* s = src.f32();
  float* d = dst.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * cd + dst_col, s + i * cs + src_col, sizeof(float) * cols);
}

void CpuDevice::fill(const Tensor& x, float value) {
  if (x.dtype() != DType::kF32) {
    if (value != 0.0f) throw std::invalid_argument("fill of a non-f32 tensor with a non-zero value");
    std::memset(x.raw(), 0, x.nbytes());
    return;
  }
  const int64_t n = x.numel();
  float* p = x.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuDevice::cast(const Tensor& dst, const Tensor& src) {
  same_numel(dst, src, "cast");
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  const int64_t n = src.numel();
  if (dst.dtype() == DType::kBF16 && src.dtype() == DType::kF32) {
    const float* s = src.f32();
    uint16_t* d = dst.bf16();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_from_float(s[i]);
  } else if (dst.dtype() == DType::kF32 && src.dtype() == DType::kBF16) {
    const uint16_t* s = src.bf16();
    float* d = dst.f32();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = float_from_bf16(s[i]);
  } else {
    throw std::invalid_argument(std::string("cast from ") + dtype_name(src.dtype()) + " to " + dtype_name(dst.dtype()) +
                                ": only float32 <-> bfloat16");
  }
}

}  // namespace meshtrain
