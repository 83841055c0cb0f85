// CPU grouped-query attention, flash style: probabilities are never stored; backward recomputes
// them from q, k and the saved log-sum-exp (Dao et al. 2022, Algorithms 1 and 2). One kernel
// serves the whole causal sequence (attention_forward / attention_backward) and the blocks of
// context parallelism (a query chunk against a key chunk, no mask or a causal diagonal; the
// backward then takes the global log-sum-exp and accumulates). Under document masking
// (DocumentMask) a query row sees one contiguous key range, [doc start, itself]: the loops run
// over that range only, so keys of other documents cost nothing, forward and backward.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

namespace {

struct Dims {
  int64_t b, tq, tk, hq, hkv, dh;
};

Dims check(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask) {
  if (q.ndim() != 4 || k.ndim() != 4 || k.shape() != v.shape() || k.dim(0) != q.dim(0) || k.dim(3) != q.dim(3) ||
      k.dim(2) < 1 || q.dim(2) % k.dim(2) || (mask == AttentionMask::kCausal && k.dim(1) != q.dim(1)))
    throw std::invalid_argument(std::string(fn) + ": attention shapes q " + shape_str(q.shape()) + " k " +
                                shape_str(k.shape()) + " v " + shape_str(v.shape()) +
                                (mask == AttentionMask::kCausal ? " (causal: Tq == Tk)" : ""));
  return Dims{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}

// The keys query row i of sample b sees: [lo, hi) in the call's key indices. Causal (or kNone)
// gives the upper end; the document mask moves the lower end to the row's document start.
struct KeyRange {
  int64_t lo, hi;
};

class RowRanges {
 public:
  /// @throws std::invalid_argument when docs.doc_start is not i32 [B, ≥ offset + length].
  RowRanges(const char* fn, const Dims& d, AttentionMask mask, const DocumentMask& docs)
      : d_(d), causal_(mask == AttentionMask::kCausal), docs_(docs) {
    if (!docs.active()) return;
    const Tensor& t = docs.doc_start;
    if (t.dtype() != DType::kI32 || t.ndim() != 2 || t.dim(0) != d.b || docs.q_offset < 0 || docs.k_offset < 0 ||
        t.dim(1) < docs.q_offset + d.tq || t.dim(1) < docs.k_offset + d.tk)
      throw std::invalid_argument(std::string(fn) + ": doc_start must be i32 [B = " + std::to_string(d.b) +
                                  ", T] covering queries from " + std::to_string(docs.q_offset) + " and keys from " +
                                  std::to_string(docs.k_offset) + ", got " + shape_str(t.shape()));
    starts_ = t.i32();
    seq_ = t.dim(1);
  }
  KeyRange operator()(int64_t b, int64_t i) const {
    const int64_t hi = causal_ ? i + 1 : d_.tk;
    if (!starts_) return {0, hi};
    const int64_t ds = starts_[b * seq_ + docs_.q_offset + i] - docs_.k_offset;
    return {std::clamp<int64_t>(ds, 0, hi), hi};
  }

 private:
  Dims d_;
  bool causal_;
  DocumentMask docs_;
  const int32_t* starts_ = nullptr;
  int64_t seq_ = 0;
};

void require(const char* fn, const char* what, const Tensor& t, const Shape& s) {
  if (t.shape() != s || t.dtype() != DType::kF32)
    throw std::invalid_argument(std::string(fn) + ": " + what + " must be f32 " + shape_str(s) + ", got " +
                                shape_str(t.shape()));
}

// kt[d][j] = k[b, j, kvh, d]: makes the q·k dot products of one query row vectorize over j.
void transpose_head(const float* src, int64_t t, int64_t row_stride, int64_t dh, float* dst) {
  for (int64_t j = 0; j < t; ++j)
    for (int64_t c = 0; c < dh; ++c) dst[c * t + j] = src[j * row_stride + c];
}

// Forward of queries [B, Tq] against keys [B, Tk]: every key (kNone) or keys s ≤ t (kCausal,
// Tq == Tk), each row limited to its range. Writes out and lse (a row seeing no key: 0 and −inf).
void forward_kernel(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const RowRanges& rows,
                    const Tensor& out, const Tensor& lse, float scale) {
  const int64_t group = d.hq / d.hkv, qs = d.hq * d.dh, ks = d.hkv * d.dh;
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  float *op = out.f32(), *lp = lse.f32();
#pragma omp parallel
  {
    std::vector<float> kt(size_t(d.dh) * d.tk), s(d.tk);
#pragma omp for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < d.b; ++bi)
      for (int64_t h = 0; h < d.hq; ++h) {
        const int64_t kvh = h / group;
        const float* kbase = kp + bi * d.tk * ks + kvh * d.dh;
        const float* vbase = vp + bi * d.tk * ks + kvh * d.dh;
        transpose_head(kbase, d.tk, ks, d.dh, kt.data());
        for (int64_t i = 0; i < d.tq; ++i) {
          const float* qi = qp + (bi * d.tq + i) * qs + h * d.dh;
          float* sp = s.data();
          const auto [j0, n] = rows(bi, i);
          float* oi = op + (bi * d.tq + i) * qs + h * d.dh;
          for (int64_t c = 0; c < d.dh; ++c) oi[c] = 0.0f;
          if (j0 >= n) {  // every key of this block lies in another document
            lp[(bi * d.hq + h) * d.tq + i] = -std::numeric_limits<float>::infinity();
            continue;
          }
          for (int64_t j = j0; j < n; ++j) sp[j] = 0.0f;
          for (int64_t c = 0; c < d.dh; ++c) {
            const float qc = qi[c] * scale;
            const float* kr = kt.data() + c * d.tk;
#pragma omp simd
            for (int64_t j = j0; j < n; ++j) sp[j] += qc * kr[j];
          }
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = j0; j < n; ++j) mx = std::max(mx, sp[j]);
          float sum = 0;
          for (int64_t j = j0; j < n; ++j) {
            sp[j] = std::exp(sp[j] - mx);
            sum += sp[j];
          }
          const float inv = 1.0f / sum;
          for (int64_t j = j0; j < n; ++j) {
            const float p = sp[j] * inv;
            const float* vr = vbase + j * ks;
#pragma omp simd
            for (int64_t c = 0; c < d.dh; ++c) oi[c] += p * vr[c];
          }
          lp[(bi * d.hq + h) * d.tq + i] = mx + std::log(sum);
        }
      }
  }
}

// Backward of forward_kernel given lse (the block's own, or the global one of context
// parallelism): overwrites dq, dk, dv, or adds to them when `accumulate`.
void backward_kernel(const Dims& d, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                     const RowRanges& rows, const Tensor& out, const Tensor& lse, float scale, const Tensor& dq,
                     const Tensor& dk, const Tensor& dv, bool accumulate) {
  const int64_t group = d.hq / d.hkv, qs = d.hq * d.dh, ks = d.hkv * d.dh;
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32(), *op = out.f32(), *dop = dout.f32(), *lp = lse.f32();
  float *dqp = dq.f32(), *dkp = dk.f32(), *dvp = dv.f32();
  // One task per (batch, kv head): the query heads sharing a kv head accumulate into the same
  // dk / dv rows, so they run in the same task and need no atomics.
#pragma omp parallel
  {
    std::vector<float> kt(size_t(d.dh) * d.tk), vt(size_t(d.dh) * d.tk), p(d.tk), ds(d.tk);
    std::vector<float> dka(size_t(d.tk) * d.dh), dva(size_t(d.tk) * d.dh);
#pragma omp for collapse(2) schedule(static)
    for (int64_t bi = 0; bi < d.b; ++bi)
      for (int64_t kvh = 0; kvh < d.hkv; ++kvh) {
        const float* kbase = kp + bi * d.tk * ks + kvh * d.dh;
        const float* vbase = vp + bi * d.tk * ks + kvh * d.dh;
        transpose_head(kbase, d.tk, ks, d.dh, kt.data());
        transpose_head(vbase, d.tk, ks, d.dh, vt.data());
        std::fill(dka.begin(), dka.end(), 0.0f);
        std::fill(dva.begin(), dva.end(), 0.0f);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t i = 0; i < d.tq; ++i) {
            const int64_t row = (bi * d.tq + i) * qs + h * d.dh;
            const auto [j0, n] = rows(bi, i);
            const float *qi = qp + row, *doi = dop + row, *oi = op + row;
            const float li = lp[(bi * d.hq + h) * d.tq + i];
            float* pp = p.data();
            float* dsp = ds.data();
            float* dqi = dqp + row;
            if (!accumulate)
              for (int64_t c = 0; c < d.dh; ++c) dqi[c] = 0.0f;
            if (j0 >= n) continue;  // no key of this block in the row's document: no gradient
            for (int64_t j = j0; j < n; ++j) pp[j] = 0.0f, dsp[j] = 0.0f;
            for (int64_t c = 0; c < d.dh; ++c) {
              const float qc = qi[c] * scale, dc = doi[c];
              const float *kr = kt.data() + c * d.tk, *vr = vt.data() + c * d.tk;
#pragma omp simd
              for (int64_t j = j0; j < n; ++j) {
                pp[j] += qc * kr[j];
                dsp[j] += dc * vr[j];  // dP = dO · Vᵀ
              }
            }
            float di = 0;  // D_i = dO_i · O_i
            for (int64_t c = 0; c < d.dh; ++c) di += doi[c] * oi[c];
#pragma omp simd
            for (int64_t j = j0; j < n; ++j) {
              pp[j] = std::exp(pp[j] - li);
              dsp[j] = pp[j] * (dsp[j] - di);
            }
            for (int64_t j = j0; j < n; ++j) {
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
        for (int64_t j = 0; j < d.tk; ++j)
          for (int64_t c = 0; c < d.dh; ++c) {
            const int64_t at = bi * d.tk * ks + j * ks + kvh * d.dh + c;
            dkp[at] = (accumulate ? dkp[at] : 0.0f) + dka[j * d.dh + c];
            dvp[at] = (accumulate ? dvp[at] : 0.0f) + dva[j * d.dh + c];
          }
      }
  }
}

}  // namespace

void CpuDevice::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, float scale, const DocumentMask& docs) {
  const char* fn = "attention_forward";
  const Dims d = check(fn, q, k, v, AttentionMask::kCausal);
  forward_kernel(d, q, k, v, RowRanges(fn, d, AttentionMask::kCausal, docs), out, lse, scale);
}

void CpuDevice::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, float scale, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, const DocumentMask& docs) {
  const char* fn = "attention_backward";
  const Dims d = check(fn, q, k, v, AttentionMask::kCausal);
  backward_kernel(d, dout, q, k, v, RowRanges(fn, d, AttentionMask::kCausal, docs), out, lse, scale, dq, dk, dv,
                  /*accumulate=*/false);
}

void CpuDevice::attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask,
                                        const Tensor& out, const Tensor& lse, float scale, const DocumentMask& docs) {
  const char* fn = "attention_block_forward";
  const Dims d = check(fn, q, k, v, mask);
  require(fn, "out", out, q.shape());
  require(fn, "lse", lse, {d.b, d.hq, d.tq});
  forward_kernel(d, q, k, v, RowRanges(fn, d, mask, docs), out, lse, scale);
}

void CpuDevice::attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         AttentionMask mask, const Tensor& out, const Tensor& lse, float scale,
                                         const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                         const DocumentMask& docs) {
  const char* fn = "attention_block_backward";
  const Dims d = check(fn, q, k, v, mask);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"dout", &dout}, {"out", &out}, {"dq", &dq}})
    require(fn, name, *t, q.shape());
  require(fn, "lse", lse, {d.b, d.hq, d.tq});
  require(fn, "dk", dk, k.shape());
  require(fn, "dv", dv, k.shape());
  backward_kernel(d, dout, q, k, v, RowRanges(fn, d, mask, docs), out, lse, scale, dq, dk, dv, /*accumulate=*/true);
}

void CpuDevice::attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const char* fn = "attention_merge";
  if (out.ndim() != 4) throw std::invalid_argument(std::string(fn) + ": out must be [B, T, H, Dh], got " + shape_str(out.shape()));
  const int64_t b = out.dim(0), t = out.dim(1), h = out.dim(2), dh = out.dim(3);
  require(fn, "out", out, out.shape());
  require(fn, "out_b", out_b, out.shape());
  require(fn, "lse", lse, {b, h, t});
  require(fn, "lse_b", lse_b, {b, h, t});
  float *op = out.f32(), *lp = lse.f32();
  const float *ob = out_b.f32(), *lb = lse_b.f32();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t hi = 0; hi < h; ++hi) {
        float& l = lp[(bi * h + hi) * t + ti];
        const float l2 = lb[(bi * h + hi) * t + ti];
        float* o = op + ((bi * t + ti) * h + hi) * dh;
        const float* o2 = ob + ((bi * t + ti) * h + hi) * dh;
        if (l2 == -std::numeric_limits<float>::infinity()) continue;  // the block saw nothing
        if (l == -std::numeric_limits<float>::infinity()) {
          for (int64_t c = 0; c < dh; ++c) o[c] = o2[c];
          l = l2;
          continue;
        }
        // σ(l2 − l) is the block's share of the merged softmax mass; log σ(l − l2) =
        // −log(1 + e^(l2 − l)), written with log1p of a non-positive exponent for stability.
        const float x = l2 - l;
        const float w = x >= 0 ? 1.0f / (1.0f + std::exp(-x)) : std::exp(x) / (1.0f + std::exp(x));
        for (int64_t c = 0; c < dh; ++c) o[c] -= w * (o[c] - o2[c]);
        l = std::max(l, l2) + std::log1p(std::exp(-std::fabs(x)));
      }
}

}  // namespace meshtrain
