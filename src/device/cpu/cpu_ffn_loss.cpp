// CPU kernels: SwiGLU and the fused cross-entropy forward + backward.
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

namespace {
// {m, Σ_j exp(x_j − m)} of one row x [v], m = max_j x_j (the stable log-sum-exp's two parts).
// The sum accumulates in f64: over a 128k vocabulary an f32 accumulator (a few SIMD lanes of
// ~32k serial adds each) drifts by ~1.5e-4 relative, which moved the loss of a [8, 128256]
// row block by 1e-5 relative against an f64 reference (and against the GPU's 512-way sum).
std::pair<float, float> max_and_sum_exp(const float* x, int64_t v) {
  float mx = x[0];
  for (int64_t j = 1; j < v; ++j) mx = std::max(mx, x[j]);
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < v; ++j) sum += double(std::exp(x[j] - mx));
  return {mx, float(sum)};
}
}  // namespace

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
  check_vocab_ids(tp, n, v, "target");
  std::vector<double> row_loss(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = lp + i * v;
    const auto [mx, sum] = max_and_sum_exp(x, v);
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

void CpuDevice::cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                      int64_t vocab_size, const Tensor& stats) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  const float* lp = logits.f32();
  const int32_t* tp = targets.i32();
  float* st = stats.f32();
  check_vocab_ids(tp, n, vocab_size, "target");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = lp + i * v;
    const auto [mx, sum] = max_and_sum_exp(x, v);
    const int64_t col = int64_t(tp[i]) - vocab_start;
    st[3 * i] = mx;
    st[3 * i + 1] = sum;
    st[3 * i + 2] = col >= 0 && col < v ? x[col] : 0.0f;
  }
}

double CpuDevice::cross_entropy_combine(const Tensor& stats_all, const Tensor& lse) {
  const int64_t p = stats_all.dim(0), n = stats_all.dim(1);
  const float* st = stats_all.f32();
  float* out = lse.f32();
  std::vector<double> row_loss(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float mx = st[3 * i];
    for (int64_t r = 1; r < p; ++r) mx = std::max(mx, st[(r * n + i) * 3]);
    float sum = 0, target = 0;
    for (int64_t r = 0; r < p; ++r) {
      const float* s = st + (r * n + i) * 3;
      sum += s[1] * std::exp(s[0] - mx);
      target += s[2];  // only the shard holding the target contributes a non-zero value
    }
    out[i] = mx + std::log(sum);
    row_loss[i] = double(out[i]) - double(target);
  }
  return deterministic_sum(row_loss.data(), n);
}

void CpuDevice::cross_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                   const Tensor& lse, const Tensor& dlogits, float grad_scale, float z_loss_coeff) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  const float *lp = logits.f32(), *lsep = lse.f32();
  const int32_t* tp = targets.i32();
  float* dp = dlogits.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = lp + i * v;
    float* g = dp + i * v;
    const float l = lsep[i];
    // (1 + 2ζ·lse)·softmax: the z-loss term of the row (exactly grad_scale when ζ = 0).
    const float p_scale = grad_scale * (1.0f + 2.0f * z_loss_coeff * l);
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) g[j] = p_scale * std::exp(x[j] - l);
    const int64_t col = int64_t(tp[i]) - vocab_start;
    if (col >= 0 && col < v) g[col] -= grad_scale;
  }
}

}  // namespace meshtrain
