// CPU kernels of the Mixture-of-Experts layer: router (scores, top-k, gates), z-loss,
// sequence-wise balance statistics, dispatch gather and combine. One task per token row, each
// row's sums in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

void check_2d(const Tensor& t, int64_t rows, int64_t cols, const char* kernel, const char* name) {
  require(t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols,
          std::string(kernel) + ": " + name + " " + shape_str(t.shape()) + " is not [" + std::to_string(rows) + ", " +
              std::to_string(cols) + "]");
}

// Scores of one row: softmax over the experts or an element-wise sigmoid.
void score_row(const float* x, int64_t e, MoeScoreFunc f, float* s) {
  if (f == MoeScoreFunc::kSigmoid) {
    for (int64_t i = 0; i < e; ++i) s[i] = 1.0f / (1.0f + std::exp(-x[i]));
    return;
  }
  float m = x[0];
  for (int64_t i = 1; i < e; ++i) m = std::max(m, x[i]);
  float z = 0;
  for (int64_t i = 0; i < e; ++i) z += (s[i] = std::exp(x[i] - m));
  const float inv = 1.0f / z;
  for (int64_t i = 0; i < e; ++i) s[i] *= inv;
}

}  // namespace

void CpuDevice::moe_router_forward(const Tensor& logits, const Tensor& bias, const MoeRouting& r, bool select,
                                   const Tensor& scores, const Tensor& topk, const Tensor& gates) {
  const int64_t n = logits.dim(0), e = logits.dim(1), k = r.top_k;
  require(k >= 1 && k <= e, "moe_router_forward: top_k " + std::to_string(k) + " outside [1, " + std::to_string(e) + "]");
  check_2d(scores, n, e, "moe_router_forward", "scores");
  check_2d(topk, n, k, "moe_router_forward", "topk");
  check_2d(gates, n, k, "moe_router_forward", "gates");
  require(!bias.defined() || bias.numel() == e, "moe_router_forward: bias of " + std::to_string(bias.numel()) +
                                                    " values for " + std::to_string(e) + " experts");
  const float* lp = logits.f32();
  const float* bp = bias.defined() ? bias.f32() : nullptr;
  float *sp = scores.f32(), *gp = gates.f32();
  int32_t* ip = topk.i32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    float* s = sp + t * e;
    score_row(lp + t * e, e, r.score_func, s);
    int32_t* idx = ip + t * k;
    if (select) {
      // k passes of an arg-max over the biased scores: k is small (1-8), E at most a few
      // hundred; strict > keeps the lower index on ties.
      std::vector<char> taken(size_t(e), 0);
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        float bv = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < e; ++i) {
          if (taken[size_t(i)]) continue;
          const float v = s[i] + (bp ? bp[i] : 0.0f);
          if (best < 0 || v > bv) best = i, bv = v;
        }
        taken[size_t(best)] = 1;
        idx[j] = int32_t(best);
      }
    }
    float* g = gp + t * k;
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (g[j] = s[idx[j]]);
    const float f = r.route_norm ? r.route_scale / (sum + 1e-20f) : r.route_scale;
    for (int64_t j = 0; j < k; ++j) g[j] *= f;
  }
}

void CpuDevice::moe_router_backward(const Tensor& dgates, const Tensor& scores, const Tensor& topk,
                                    const MoeRouting& r, const Tensor& dscores_extra, const Tensor& dlogits) {
  const int64_t n = scores.dim(0), e = scores.dim(1), k = r.top_k;
  check_2d(dgates, n, k, "moe_router_backward", "dgates");
  check_2d(topk, n, k, "moe_router_backward", "topk");
  check_2d(dlogits, n, e, "moe_router_backward", "dlogits");
  if (dscores_extra.defined()) check_2d(dscores_extra, n, e, "moe_router_backward", "dscores_extra");
  const float *dg = dgates.f32(), *sp = scores.f32();
  const float* xp = dscores_extra.defined() ? dscores_extra.f32() : nullptr;
  const int32_t* ip = topk.i32();
  float* dl = dlogits.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* s = sp + t * e;
    const float* g = dg + t * k;
    const int32_t* idx = ip + t * k;
    float* ds = dl + t * e;  // the score gradient first, turned into the logits' in place
    for (int64_t i = 0; i < e; ++i) ds[i] = xp ? xp[t * e + i] : 0.0f;
    if (r.route_norm) {
      // g_j = c·u_j / Z, Z = Σ u + 1e-20: ∂L/∂u_m = c·(dg_m − Σ_j dg_j·u_j / Z) / Z.
      float z = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) z += s[idx[j]];
      z += 1e-20f;
      for (int64_t j = 0; j < k; ++j) dot += g[j] * s[idx[j]];
      for (int64_t j = 0; j < k; ++j) ds[idx[j]] += r.route_scale * (g[j] - dot / z) / z;
    } else {
      for (int64_t j = 0; j < k; ++j) ds[idx[j]] += r.route_scale * g[j];
    }
    if (r.score_func == MoeScoreFunc::kSigmoid) {
      for (int64_t i = 0; i < e; ++i) ds[i] *= s[i] * (1.0f - s[i]);
    } else {
      float dot = 0;
      for (int64_t i = 0; i < e; ++i) dot += s[i] * ds[i];
      for (int64_t i = 0; i < e; ++i) ds[i] = s[i] * (ds[i] - dot);
    }
  }
}

double CpuDevice::moe_z_loss(const Tensor& logits, float grad_scale, const Tensor& dlogits) {
  const int64_t n = logits.dim(0), e = logits.dim(1);
  if (dlogits.defined()) check_2d(dlogits, n, e, "moe_z_loss", "dlogits");
  const float* lp = logits.f32();
  float* dp = dlogits.defined() ? dlogits.f32() : nullptr;
  std::vector<double> sq(size_t(n), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* x = lp + t * e;
    float m = x[0];
    for (int64_t i = 1; i < e; ++i) m = std::max(m, x[i]);
    float z = 0;
    for (int64_t i = 0; i < e; ++i) z += std::exp(x[i] - m);
    const float lse = m + std::log(z);
    sq[size_t(t)] = double(lse) * double(lse);
    if (dp) {
      const float c = grad_scale * 2.0f * lse;
      for (int64_t i = 0; i < e; ++i) dp[t * e + i] += c * std::exp(x[i] - lse);
    }
  }
  double total = 0;
  for (double v : sq) total += v;
  return total;
}

void CpuDevice::moe_aux_stats(const Tensor& scores, const Tensor& sample, MoeScoreFunc f, const Tensor& sums) {
  const int64_t n = scores.dim(0), e = scores.dim(1), s_count = sums.dim(0);
  require(sample.numel() == n, "moe_aux_stats: " + std::to_string(sample.numel()) + " sample ids for " +
                                   std::to_string(n) + " rows");
  check_2d(sums, s_count, e, "moe_aux_stats", "sums");
  const float* sp = scores.f32();
  const int32_t* smp = sample.i32();
  float* out = sums.f32();
  std::fill(out, out + s_count * e, 0.0f);
  // Rows of one sample may be anywhere (chunk-major cp layouts): parallel over experts, rows in order.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < e; ++i)
    for (int64_t t = 0; t < n; ++t) {
      const float* s = sp + t * e;
      float v = s[i];
      if (f == MoeScoreFunc::kSigmoid) {
        float z = 0;
        for (int64_t j = 0; j < e; ++j) z += s[j];
        v /= z;
      }
      out[int64_t(smp[t]) * e + i] += v;
    }
}

void CpuDevice::moe_aux_backward(const Tensor& coef, const Tensor& sample, const Tensor& scores, MoeScoreFunc f,
                                 const Tensor& dscores) {
  const int64_t n = scores.dim(0), e = scores.dim(1);
  require(sample.numel() == n, "moe_aux_backward: " + std::to_string(sample.numel()) + " sample ids for " +
                                   std::to_string(n) + " rows");
  require(coef.ndim() == 2 && coef.dim(1) == e, "moe_aux_backward: coef " + shape_str(coef.shape()) + " is not [S, " +
                                                    std::to_string(e) + "]");
  check_2d(dscores, n, e, "moe_aux_backward", "dscores");
  const float *cp = coef.f32(), *sp = scores.f32();
  const int32_t* smp = sample.i32();
  float* dp = dscores.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cp + int64_t(smp[t]) * e;
    const float* s = sp + t * e;
    float* d = dp + t * e;
    if (f == MoeScoreFunc::kSoftmax) {
      for (int64_t i = 0; i < e; ++i) d[i] = c[i];
      continue;
    }
    // s' = s / Z: ∂/∂s_j Σ_i c_i·s_i/Z = (c_j − Σ_i c_i·s'_i) / Z.
    float z = 0, dot = 0;
    for (int64_t i = 0; i < e; ++i) z += s[i];
    for (int64_t i = 0; i < e; ++i) dot += c[i] * s[i];
    dot /= z;
    for (int64_t i = 0; i < e; ++i) d[i] = (c[i] - dot) / z;
  }
}

void CpuDevice::gather_rows(const Tensor& src, const Tensor& index, const Tensor& dst) {
  const int64_t n = src.dim(0), d = src.dim(1), r = index.numel();
  check_2d(dst, r, d, "gather_rows", "dst");
  require(src.dtype() == dst.dtype(), "gather_rows: src and dst dtypes differ");
  const int32_t* ip = index.i32();
  for (int64_t i = 0; i < r; ++i)
    if (ip[i] < 0 || ip[i] >= n)
      throw std::out_of_range("gather_rows: index " + std::to_string(ip[i]) + " outside [0, " + std::to_string(n) + ")");
  const float* sp = src.f32();
  float* dp = dst.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < r; ++i) std::copy(sp + int64_t(ip[i]) * d, sp + (int64_t(ip[i]) + 1) * d, dp + i * d);
}

void CpuDevice::moe_combine(const Tensor& y, const Tensor& rows, const Tensor& gates, const Tensor& out) {
  const int64_t r = y.dim(0), d = y.dim(1), n = rows.dim(0), k = rows.dim(1);
  check_2d(out, n, d, "moe_combine", "out");
  if (gates.defined()) check_2d(gates, n, k, "moe_combine", "gates");
  const float* yp = y.f32();
  const float* gp = gates.defined() ? gates.f32() : nullptr;
  const int32_t* ip = rows.i32();
  float* op = out.f32();
  for (int64_t i = 0; i < n * k; ++i)
    require(ip[i] >= 0 && ip[i] < r, "moe_combine: row " + std::to_string(ip[i]) + " outside [0, " +
                                         std::to_string(r) + ")");
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    float* o = op + t * d;
    std::fill(o, o + d, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float g = gp ? gp[t * k + j] : 1.0f;
      const float* src = yp + int64_t(ip[t * k + j]) * d;
      for (int64_t c = 0; c < d; ++c) o[c] += g * src[c];
    }
  }
}

void CpuDevice::moe_combine_backward(const Tensor& dout, const Tensor& y, const Tensor& rows, const Tensor& gates,
                                     const Tensor& dy, const Tensor& dgates) {
  const int64_t r = y.dim(0), d = y.dim(1), n = rows.dim(0), k = rows.dim(1);
  check_2d(dout, n, d, "moe_combine_backward", "dout");
  check_2d(gates, n, k, "moe_combine_backward", "gates");
  check_2d(dgates, n, k, "moe_combine_backward", "dgates");
  check_2d(dy, r, d, "moe_combine_backward", "dy");
  const float *gp = dout.f32(), *yp = y.f32(), *wp = gates.f32();
  const int32_t* ip = rows.i32();
  float *dyp = dy.f32(), *dgp = dgates.f32();
  for (int64_t i = 0; i < n * k; ++i)
    require(ip[i] >= 0 && ip[i] < r, "moe_combine_backward: row " + std::to_string(ip[i]) + " outside [0, " +
                                         std::to_string(r) + ")");
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* g = gp + t * d;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = ip[t * k + j];
      const float w = wp[t * k + j];
      const float* src = yp + row * d;
      float* dst = dyp + row * d;
      float dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        dot += g[c] * src[c];
        dst[c] = w * g[c];
      }
      dgp[t * k + j] = dot;
    }
  }
}

}  // namespace meshtrain
