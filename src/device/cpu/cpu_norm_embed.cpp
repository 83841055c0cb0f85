// CPU kernels: embedding, RMSNorm, RoPE.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

void CpuDevice::embedding_forward(const Tensor& weight, const Tensor& tokens, const Tensor& out, int64_t vocab_start,
                                  int64_t vocab_size) {
  const int64_t n = tokens.numel(), d = weight.dim(1), v = weight.dim(0);
  const int32_t* tok = tokens.i32();
  const float* w = weight.f32();
  float* o = out.f32();
  check_vocab_ids(tok, n, vocab_size, "token");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = int64_t(tok[i]) - vocab_start;
    if (row >= 0 && row < v)
      std::memcpy(o + i * d, w + row * d, sizeof(float) * d);
    else
      std::memset(o + i * d, 0, sizeof(float) * d);
  }
}

void CpuDevice::embedding_backward(const Tensor& grad_out, const Tensor& tokens, const Tensor& grad_weight,
                                   int64_t vocab_start) {
  const int64_t n = tokens.numel(), d = grad_weight.dim(1), v = grad_weight.dim(0);
  const int32_t* tok = tokens.i32();
  const float* g = grad_out.f32();
  float* gw = grad_weight.f32();
  // Threads own disjoint column slices, so rows hit by repeated tokens never race and the
  // accumulation order (token order) is fixed.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = d * t / nt, c1 = d * (t + 1) / nt;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = int64_t(tok[i]) - vocab_start;
      if (row < 0 || row >= v) continue;
      float* dst = gw + row * d;
      const float* src = g + i * d;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void CpuDevice::rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  const int64_t d = x.dim(-1), n = x.numel() / d;
  if (w.numel() != d) throw std::invalid_argument("rmsnorm weight " + shape_str(w.shape()) + " vs x " + shape_str(x.shape()));
  const float *xp = x.f32(), *wp = w.f32();
  float *yp = y.f32(), *rp = rstd.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = xp + i * d;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < d; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / float(d) + eps);
    rp[i] = r;
    float* yr = yp + i * d;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) yr[c] = xr[c] * r * wp[c];
  }
}

namespace {
// @throws std::invalid_argument unless t has n elements (what names the kernel and argument).
void require_numel(const Tensor& t, int64_t n, const char* what) {
  if (t.numel() != n)
    throw std::invalid_argument(std::string(what) + " has shape " + shape_str(t.shape()) + ", expected " +
                                std::to_string(n) + " elements");
}

// The dW term of one row, Σ g·x·r into this thread's partial pw [D]. The fused loop below
// writes the same statement, so the two compile to the same per-element arithmetic.
inline void accumulate_dw_row(float* pw, const float* g, const float* xr, float r, int64_t d) {
#pragma omp simd
  for (int64_t c = 0; c < d; ++c) pw[c] += g[c] * xr[c] * r;
}

// dw [D] += the nt per-thread partials [nt, D], in thread order: deterministic for a given
// thread count.
void sum_dw_partials(const std::vector<float>& partial, int nt, int64_t d, float* dwp) {
  for (int t = 0; t < nt; ++t)
    for (int64_t c = 0; c < d; ++c) dwp[c] += partial[size_t(t) * d + c];
}

// The RMSNorm backward shared by rmsnorm_backward (residual = nullptr) and
// rmsnorm_backward_residual: dx = [residual +] r·g·w − (r³·Σ g·w·x / D)·x; dw accumulates
// Σ g·x·r through per-thread partials over a static row partition, summed in thread order
// (rmsnorm_backward_weight repeats exactly this). An undefined dw skips that term without
// touching dx's arithmetic. residual may alias dx: each element is read before it is written,
// in one iteration.
void rmsnorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                           const float* residual, const Tensor& dx, const Tensor& dw, int nt) {
  const int64_t d = x.dim(-1), n = x.numel() / d;
  const float *dyp = dy.f32(), *xp = x.f32(), *wp = w.f32(), *rp = rstd.f32();
  float* dxp = dx.f32();
  const bool weight = dw.defined();
  std::vector<float> partial(weight ? size_t(nt) * d : 0, 0.0f);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    float* pw = weight ? partial.data() + size_t(t) * d : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float *g = dyp + i * d, *xr = xp + i * d;
      const float r = rp[i];
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < d; ++c) dot += g[c] * wp[c] * xr[c];
      const float k = r * r * r * dot / float(d);
      float* o = dxp + i * d;
      const float* res = residual ? residual + i * d : nullptr;
      if (res && pw) {
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) {
          o[c] = res[c] + (r * g[c] * wp[c] - k * xr[c]);
          pw[c] += g[c] * xr[c] * r;
        }
      } else if (pw) {
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) {
          o[c] = r * g[c] * wp[c] - k * xr[c];
          pw[c] += g[c] * xr[c] * r;
        }
      } else if (res) {
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] = res[c] + (r * g[c] * wp[c] - k * xr[c]);
      } else {
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] = r * g[c] * wp[c] - k * xr[c];
      }
    }
  }
  if (weight) sum_dw_partials(partial, nt, d, dw.f32());
}
}  // namespace

void CpuDevice::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                 const Tensor& dx, const Tensor& dw) {
  rmsnorm_backward_impl(dy, x, w, rstd, nullptr, dx, dw, threads_);
}

void CpuDevice::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& dw) {
  const int64_t d = x.dim(-1), n = x.numel() / d;
  require_numel(dy, x.numel(), "rmsnorm_backward_weight: dy");
  require_numel(rstd, n, "rmsnorm_backward_weight: rstd");
  require_numel(dw, d, "rmsnorm_backward_weight: dw");
  const float *dyp = dy.f32(), *xp = x.f32(), *rp = rstd.f32();
  const int nt = threads_;
  std::vector<float> partial(size_t(nt) * d, 0.0f);
  // The fused kernel's partition (static schedule over the same nt threads) and row order.
#pragma omp parallel num_threads(nt)
  {
    float* pw = partial.data() + size_t(omp_get_thread_num()) * d;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) accumulate_dw_row(pw, dyp + i * d, xp + i * d, rp[i], d);
  }
  sum_dw_partials(partial, nt, d, dw.f32());
}

void CpuDevice::add_rmsnorm_forward(const Tensor& h, const Tensor& delta, const Tensor& w, float eps, const Tensor& y,
                                    const Tensor& rstd) {
  require_numel(delta, h.numel(), "add_rmsnorm_forward: delta");
  require_numel(y, h.numel(), "add_rmsnorm_forward: y");
  const int64_t n = h.numel();
  float* hp = h.f32();
  const float* dp = delta.f32();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) hp[i] += dp[i];
  rmsnorm_forward(h, w, eps, y, rstd);
}

void CpuDevice::rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                          const Tensor& residual, const Tensor& dx, const Tensor& dw) {
  require_numel(residual, x.numel(), "rmsnorm_backward_residual: residual");
  require_numel(dx, x.numel(), "rmsnorm_backward_residual: dx");
  rmsnorm_backward_impl(dy, x, w, rstd, residual.f32(), dx, dw, threads_);
}

void CpuDevice::rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  const int64_t b = x.dim(0), t = x.dim(1), h = x.dim(2), dh = x.dim(3), half = dh / 2;
  if (cos.dim(0) < t || cos.dim(1) != half) throw std::invalid_argument("rope table " + shape_str(cos.shape()) + " for x " + shape_str(x.shape()));
  float* xp = x.f32();
  const float *cp = cos.f32(), *sp = sin.f32();
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti) {
      const float *c = cp + ti * half, *s = sp + ti * half;
      for (int64_t hi = 0; hi < h; ++hi) {
        float* v = xp + ((bi * t + ti) * h + hi) * dh;
        for (int64_t j = 0; j < half; ++j) {
          const float a = v[2 * j], bb = v[2 * j + 1], sn = sign * s[j];
          v[2 * j] = a * c[j] - bb * sn;
          v[2 * j + 1] = a * sn + bb * c[j];
        }
      }
    }
}

}  // namespace meshtrain
