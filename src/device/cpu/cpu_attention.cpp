// CPU causal grouped-query attention, flash style: probabilities are never stored; backward
// recomputes them from q, k and the saved log-sum-exp (Dao et al. 2022, Algorithms 1 and 2).
#include <omp.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

namespace {

struct Dims {
  int64_t b, t, hq, hkv, dh;
};

Dims check(const Tensor& q, const Tensor& k, const Tensor& v) {
  Dims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  if (k.shape() != v.shape() || k.dim(0) != d.b || k.dim(1) != d.t || k.dim(3) != d.dh || d.hq % d.hkv)
    throw std::invalid_argument("attention shapes q " + shape_str(q.shape()) + " k " + shape_str(k.shape()) + " v " +
                                shape_str(v.shape()));
  return d;
}

// kt[d][j] = k[b, j, kvh, d]: makes the q·k dot products of one query row vectorize over j.
void transpose_head(const float* src, int64_t t, int64_t row_stride, int64_t dh, float* dst) {
  for (int64_t j = 0; j < t; ++j)
    for (int64_t c = 0; c < dh; ++c) dst[c * t + j] = src[j * row_stride + c];
}

}  // namespace

void CpuDevice::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, float scale) {
  const Dims d = check(q, k, v);
  const int64_t group = d.hq / d.hkv, qs = d.hq * d.dh, ks = d.hkv * d.dh;
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  float *op = out.f32(), *lp = lse.f32();
#pragma omp parallel
  {
    std::vector<float> kt(size_t(d.dh) * d.t), s(d.t);
#pragma omp for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < d.b; ++bi)
      for (int64_t h = 0; h < d.hq; ++h) {
        const int64_t kvh = h / group;
        const float* kbase = kp + bi * d.t * ks + kvh * d.dh;
        const float* vbase = vp + bi * d.t * ks + kvh * d.dh;
        transpose_head(kbase, d.t, ks, d.dh, kt.data());
        for (int64_t i = 0; i < d.t; ++i) {
          const float* qi = qp + (bi * d.t + i) * qs + h * d.dh;
          float* sp = s.data();
          const int64_t n = i + 1;
          for (int64_t j = 0; j < n; ++j) sp[j] = 0.0f;
          for (int64_t c = 0; c < d.dh; ++c) {
            const float qc = qi[c] * scale;
            const float* kr = kt.data() + c * d.t;
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) sp[j] += qc * kr[j];
          }
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < n; ++j) mx = std::max(mx, sp[j]);
          float sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            sp[j] = std::exp(sp[j] - mx);
            sum += sp[j];
          }
          const float inv = 1.0f / sum;
          float* oi = op + (bi * d.t + i) * qs + h * d.dh;
          for (int64_t c = 0; c < d.dh; ++c) oi[c] = 0.0f;
          for (int64_t j = 0; j < n; ++j) {
            const float p = sp[j] * inv;
            const float* vr = vbase + j * ks;
#pragma omp simd
            for (int64_t c = 0; c < d.dh; ++c) oi[c] += p * vr[c];
          }
          lp[(bi * d.hq + h) * d.t + i] = mx + std::log(sum);
        }
      }
  }
}

void CpuDevice::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, float scale, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv) {
  const Dims d = check(q, k, v);
  const int64_t group = d.hq / d.hkv, qs = d.hq * d.dh, ks = d.hkv * d.dh;
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32(), *op = out.f32(), *dop = dout.f32(), *lp = lse.f32();
  float *dqp = dq.f32(), *dkp = dk.f32(), *dvp = dv.f32();
  // One task per (batch, kv head): the query heads sharing a kv head accumulate into the same
  // dk / dv rows, so they run in the same task and need no atomics.
#pragma omp parallel
  {
    std::vector<float> kt(size_t(d.dh) * d.t), vt(size_t(d.dh) * d.t), p(d.t), ds(d.t);
    std::vector<float> dka(size_t(d.t) * d.dh), dva(size_t(d.t) * d.dh);
#pragma omp for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < d.b; ++bi)
      for (int64_t kvh = 0; kvh < d.hkv; ++kvh) {
        const float* kbase = kp + bi * d.t * ks + kvh * d.dh;
        const float* vbase = vp + bi * d.t * ks + kvh * d.dh;
        transpose_head(kbase, d.t, ks, d.dh, kt.data());
        transpose_head(vbase, d.t, ks, d.dh, vt.data());
        std::fill(dka.begin(), dka.end(), 0.0f);
        std::fill(dva.begin(), dva.end(), 0.0f);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t i = 0; i < d.t; ++i) {
            const int64_t row = (bi * d.t + i) * qs + h * d.dh, n = i + 1;
            const float *qi = qp + row, *doi = dop + row, *oi = op + row;
            const float li = lp[(bi * d.hq + h) * d.t + i];
            float* pp = p.data();
            float* dsp = ds.data();
            for (int64_t j = 0; j < n; ++j) pp[j] = 0.0f, dsp[j] = 0.0f;
            for (int64_t c = 0; c < d.dh; ++c) {
              const float qc = qi[c] * scale, dc = doi[c];
              const float *kr = kt.data() + c * d.t, *vr = vt.data() + c * d.t;
#pragma omp simd
              for (int64_t j = 0; j < n; ++j) {
                pp[j] += qc * kr[j];
                dsp[j] += dc * vr[j];  // dP = dO · Vᵀ
              }
            }
            float di = 0;  // D_i = dO_i · O_i
            for (int64_t c = 0; c < d.dh; ++c) di += doi[c] * oi[c];
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) {
              pp[j] = std::exp(pp[j] - li);
              dsp[j] = pp[j] * (dsp[j] - di);
            }
            float* dqi = dqp + row;
            for (int64_t c = 0; c < d.dh; ++c) dqi[c] = 0.0f;
            for (int64_t j = 0; j < n; ++j) {
              const float sj = dsp[j] * scale, pj = pp[j];
              const float* kr = kbase + j * ks;
              float *dkr = dka.data() + j * d.dh, *dvr = dva.data() + j * d.dh;
#pragma omp simd
              for (int64_t c = 0; c < d.dh; ++c) {
                dqi[c] += sj * kr[c];
                dkr[c] += sj * qi[c];
                dvr[c] += pj * doi[c];
              }
            }
          }
        }
        for (int64_t j = 0; j < d.t; ++j)
          for (int64_t c = 0; c < d.dh; ++c) {
            dkp[bi * d.t * ks + j * ks + kvh * d.dh + c] = dka[j * d.dh + c];
            dvp[bi * d.t * ks + j * ks + kvh * d.dh + c] = dva[j * d.dh + c];
          }
      }
  }
}

}  // namespace meshtrain
