// CUDA kernels of the Mixture-of-Experts layer: router (scores, top-k, gates) and its backward,
// router z-loss, the sequence-wise balance statistics and their gradient, the dispatch gather
// and the combine with its backward. Same arithmetic as the CPU reference (cpu_moe.cpp).
//
// Determinism: no atomics anywhere; every sum runs in an order fixed by the shapes alone (a
// lane-strided partial then a fixed shuffle tree, a serial loop, or fixed chunks summed in
// order), so repeated calls give bitwise-identical results.
//
// Router-side kernels give each token row one warp: E is at most a few hundred, so a warp keeps
// every lane busy with no block barriers, and element i of a row always belongs to lane i % 32
// (a lane can re-read what it wrote without synchronizing). Activation-side kernels (gather,
// combine) give each output row one block over its columns, 16-byte vectors where aligned.
//
// Index operands (topk with select = false, sample, index, rows) come from the caller's own
// routing and are not checked on the host: that would cost a synchronization per call. An index
// out of range is never dereferenced; the outputs it feeds become NaN instead, so the error
// surfaces as a non-finite loss rather than as an out-of-bounds access.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/reduce.cuh"
#include "device/cuda/vec_io.cuh"

namespace meshtrain {

namespace {
using namespace cuda;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRowWarps = 8;  // token rows per block of the warp-per-row kernels
constexpr int kRowThreads = 32 * kRowWarps;
constexpr int kColThreads = 256;  // most threads of the block-per-row kernels
constexpr int64_t kMaxGrid = 1 << 20;
/// Rows per partial sum of moe_aux_stats: part of the summation order, so a constant (changing
/// it changes the rounding, never the determinism).
constexpr int64_t kAuxChunk = 256;

/// Grid of the warp-per-row kernels (grid-stride over rows beyond it).
unsigned warp_rows_grid(int64_t rows) { return unsigned(std::clamp<int64_t>(ceil_div(rows, kRowWarps), 1, kMaxGrid)); }
unsigned block_rows_grid(int64_t rows) { return unsigned(std::clamp<int64_t>(rows, 1, kMaxGrid)); }
/// Threads of a block-per-row kernel over nvec vectors: whole warps, at most kColThreads.
int col_threads(int64_t nvec) { return std::min(kColThreads, round_up_warp(nvec)); }

/// The rows of this warp: first row and stride of a grid-stride loop over token rows.
struct WarpRows {
  int64_t first, stride;
  int lane;
};
__device__ __forceinline__ WarpRows warp_rows() {
  return {int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5), int64_t(gridDim.x) * kRowWarps,
          int(threadIdx.x & 31)};
}

/// A NaN-filled vector (what an out-of-range index produces).
template <int VEC>
__device__ __forceinline__ void fill_nan(float (&v)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = NAN;
}

// ---- router ----

/// scores[t] = softmax or sigmoid of logits[t]; with SELECT, topk[t] = the k largest of
/// scores[t] + bias in descending order, ties to the lower expert; gates[t] from topk[t].
///
/// The selection makes k passes of a warp arg-max over the order "biased score descending, then
/// index ascending", which is total once NaN is ranked as −inf: pass j takes the best element
/// after pass j−1's pick in that order, so no taken-set is needed and E is unbounded. Gates run
/// on lane 0 in j order, the CPU's summation order.
template <bool SELECT>
__global__ void __launch_bounds__(kRowThreads)
    moe_router_forward_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t n, int64_t e,
                              int k, bool sigmoid, bool norm, float scale, float* scores, int32_t* topk,
                              float* __restrict__ gates) {
  const WarpRows w = warp_rows();
  for (int64_t t = w.first; t < n; t += w.stride) {
    const float* x = logits + t * e;
    float* s = scores + t * e;
    if (sigmoid) {
      for (int64_t i = w.lane; i < e; i += 32) s[i] = 1.0f / (1.0f + expf(-x[i]));
    } else {
      float m = -INFINITY;
      for (int64_t i = w.lane; i < e; i += 32) m = fmaxf(m, x[i]);
      m = warp_max(m);
      float z = 0.0f;
      for (int64_t i = w.lane; i < e; i += 32) z += expf(x[i] - m);
      const float inv = 1.0f / warp_sum(z);
      for (int64_t i = w.lane; i < e; i += 32) s[i] = expf(x[i] - m) * inv;
    }
    int32_t* idx = topk + t * int64_t(k);
    if constexpr (SELECT) {
      float lv = 0.0f;
      int li = -1;  // the previous pick; −1 before the first
      for (int j = 0; j < k; ++j) {
        float bv = 0.0f;
        int bi = -1;
        for (int64_t i = w.lane; i < e; i += 32) {  // this lane's own scores: no barrier needed
          float v = s[i] + (bias ? bias[i] : 0.0f);
          if (v != v) v = -INFINITY;
          const bool after = li < 0 || v < lv || (v == lv && int(i) > li);
          if (after && (bi < 0 || v > bv)) bv = v, bi = int(i);  // i ascends: ties keep the lower
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float ov = __shfl_xor_sync(kFullMask, bv, o);
          const int oi = __shfl_xor_sync(kFullMask, bi, o);
          if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        lv = bv, li = bi;  // the same on every lane: the merge is symmetric
        if (w.lane == 0) idx[j] = bi;
      }
    }
    __syncwarp();  // lane 0 reads scores other lanes wrote
    if (w.lane == 0) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += idx[j] >= 0 && idx[j] < e ? s[idx[j]] : NAN;
      const float f = norm ? scale / (sum + 1e-20f) : scale;
      for (int j = 0; j < k; ++j) gates[t * k + j] = (idx[j] >= 0 && idx[j] < e ? s[idx[j]] : NAN) * f;
    }
  }
}

/// dlogits[t] from dgates[t] (and dscores_extra[t]) through route_scale, route_norm and the score
/// function. The score gradient is staged in dlogits: lane i % 32 writes element i, then adds the
/// route terms of the picks it owns in j order (so repeated picks add up as on the CPU), then
/// turns its elements into the logits' gradient. Z and the dot product of route_norm are summed
/// serially by every lane, in the CPU's order. A pick outside [0, E) makes the row NaN.
__global__ void __launch_bounds__(kRowThreads)
    moe_router_backward_kernel(const float* __restrict__ dgates, const float* __restrict__ scores,
                               const int32_t* __restrict__ topk, const float* extra, int64_t n, int64_t e, int k,
                               bool sigmoid, bool norm, float scale, float* dlogits) {
  const WarpRows w = warp_rows();
  for (int64_t t = w.first; t < n; t += w.stride) {
    const float* s = scores + t * e;
    const float* g = dgates + t * k;
    const int32_t* idx = topk + t * k;
    float* ds = dlogits + t * e;
    bool bad = false;
    float z = 0.0f, dot = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t c = idx[j];
      if (c < 0 || c >= e)
        bad = true;
      else
        z += s[c];
    }
    z += 1e-20f;
    if (norm && !bad)
      for (int j = 0; j < k; ++j) dot += g[j] * s[idx[j]];
    for (int64_t i = w.lane; i < e; i += 32) ds[i] = extra ? extra[t * e + i] : 0.0f;
    if (!bad)
      for (int j = 0; j < k; ++j) {
        const int32_t c = idx[j];
        if ((c & 31) == w.lane) ds[c] += norm ? scale * (g[j] - dot / z) / z : scale * g[j];
      }
    if (sigmoid) {
      for (int64_t i = w.lane; i < e; i += 32) ds[i] = bad ? NAN : ds[i] * (s[i] * (1.0f - s[i]));
    } else {
      float d = 0.0f;
      for (int64_t i = w.lane; i < e; i += 32) d += s[i] * ds[i];
      d = warp_sum(d);
      for (int64_t i = w.lane; i < e; i += 32) ds[i] = bad ? NAN : s[i] * (ds[i] - d);
    }
  }
}

/// row_sq[t] = lse_t² (fp64) of logits[t]; with GRAD, dlogits[t] += grad_scale·2·lse_t·softmax.
/// dlogits may alias logits (each element is read, then written, by one lane).
template <bool GRAD>
__global__ void __launch_bounds__(kRowThreads)
    moe_z_loss_kernel(const float* logits, int64_t n, int64_t e, float grad_scale, float* dlogits,
                      double* __restrict__ row_sq) {
  const WarpRows w = warp_rows();
  for (int64_t t = w.first; t < n; t += w.stride) {
    const float* x = logits + t * e;
    float m = -INFINITY;
    for (int64_t i = w.lane; i < e; i += 32) m = fmaxf(m, x[i]);
    m = warp_max(m);
    float z = 0.0f;
    for (int64_t i = w.lane; i < e; i += 32) z += expf(x[i] - m);
    const float lse = m + logf(warp_sum(z));
    if (w.lane == 0) row_sq[t] = double(lse) * double(lse);
    if constexpr (GRAD) {
      const float c = grad_scale * 2.0f * lse;
      float* d = dlogits + t * e;
      for (int64_t i = w.lane; i < e; i += 32) d[i] += c * expf(x[i] - lse);
    }
  }
}

// ---- sequence-wise balance loss ----

/// rowsum[t] = Σ_e scores[t, e]: sigmoid scores' per-row normalizer, computed once instead of
/// once per (sample, expert) thread of moe_aux_partial_kernel.
__global__ void __launch_bounds__(kRowThreads)
    moe_row_sum_kernel(const float* __restrict__ scores, int64_t n, int64_t e, float* __restrict__ rowsum) {
  const WarpRows w = warp_rows();
  for (int64_t t = w.first; t < n; t += w.stride) {
    float z = 0.0f;
    for (int64_t i = w.lane; i < e; i += 32) z += scores[t * e + i];
    z = warp_sum(z);
    if (w.lane == 0) rowsum[t] = z;
  }
}

/// One thread per (chunk c, sample s, expert e), expert fastest (coalesced score reads):
/// out[c, s, e] = Σ over rows r of chunk c in order with sample[r] = s of scores[r, e]
/// (/ rowsum[r] when rowsum is given). Rows of one sample may lie anywhere (chunk-major context-
/// parallel layouts), so each thread scans its chunk's sample ids: N·S·E compares in all, cheap
/// for the few samples of a micro-batch. Unknown sample ids match no thread.
__global__ void __launch_bounds__(256)
    moe_aux_partial_kernel(const float* __restrict__ scores, const int32_t* __restrict__ sample,
                           const float* __restrict__ rowsum, int64_t n, int64_t e, int64_t s_count, int64_t chunks,
                           float* __restrict__ out) {
  const int64_t total = chunks * s_count * e;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; id < total; id += stride) {
    const int64_t ei = id % e, si = (id / e) % s_count, c = id / (e * s_count);
    const int64_t end = (c + 1) * kAuxChunk, r1 = end < n ? end : n;
    float acc = 0.0f;
    for (int64_t r = c * kAuxChunk; r < r1; ++r)
      if (sample[r] == si) {
        float v = scores[r * e + ei];
        if (rowsum) v /= rowsum[r];
        acc += v;
      }
    out[id] = acc;
  }
}

/// sums[s, e] = Σ_c partial[c, s, e] in chunk order; one thread per (s, e).
__global__ void __launch_bounds__(256)
    moe_aux_chunks_kernel(const float* __restrict__ partial, int64_t chunks, int64_t se, float* __restrict__ sums) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; id < se; id += stride) {
    float acc = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) acc += partial[c * se + id];
    sums[id] = acc;
  }
}

/// dscores[t] = coef[sample[t]] (softmax) or (coef[sample[t]] − Σ_e coef·s/Z) / Z with
/// Z = Σ_e scores[t, e] (sigmoid). A sample id outside [0, S) makes the row NaN.
__global__ void __launch_bounds__(kRowThreads)
    moe_aux_backward_kernel(const float* __restrict__ coef, const int32_t* __restrict__ sample,
                            const float* __restrict__ scores, int64_t n, int64_t e, int64_t s_count, bool sigmoid,
                            float* __restrict__ dscores) {
  const WarpRows w = warp_rows();
  for (int64_t t = w.first; t < n; t += w.stride) {
    const int32_t smp = sample[t];
    float* d = dscores + t * e;
    if (smp < 0 || smp >= s_count) {
      for (int64_t i = w.lane; i < e; i += 32) d[i] = NAN;
      continue;
    }
    const float* c = coef + int64_t(smp) * e;
    if (!sigmoid) {
      for (int64_t i = w.lane; i < e; i += 32) d[i] = c[i];
      continue;
    }
    const float* s = scores + t * e;
    float z = 0.0f, dot = 0.0f;
    for (int64_t i = w.lane; i < e; i += 32) z += s[i], dot += c[i] * s[i];
    z = warp_sum(z);
    dot = warp_sum(dot) / z;
    for (int64_t i = w.lane; i < e; i += 32) d[i] = (c[i] - dot) / z;
  }
}

// ---- dispatch and combine ----

/// dst[row] = src[index[row]], one block per dst row; a row whose index is outside [0, N) is NaN.
template <class T, int VEC>
__global__ void __launch_bounds__(kColThreads)
    gather_rows_kernel(const T* __restrict__ src, const int32_t* __restrict__ index, T* __restrict__ dst, int64_t r,
                       int64_t n, int64_t d) {
  const int64_t nvec = d / VEC;
  for (int64_t row = blockIdx.x; row < r; row += gridDim.x) {
    const int32_t id = index[row];
    const bool ok = id >= 0 && id < n;
    T* o = dst + row * d;
    for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
      float v[VEC];
      if (ok)
        load_vec<T, VEC>(src + int64_t(id) * d + c * VEC, v);
      else
        fill_nan(v);
      store_vec<T, VEC>(o + c * VEC, v);
    }
  }
}

/// out[t] = Σ_j g[t, j] · y[rows[t, j]] in j order with f32 accumulators, one block per token
/// row (a gather: no two blocks write one row). A row index outside [0, R) makes out[t] NaN.
template <class T, int VEC, bool GATES>
__global__ void __launch_bounds__(kColThreads)
    moe_combine_kernel(const T* __restrict__ y, const int32_t* __restrict__ rows, const float* __restrict__ gates,
                       T* __restrict__ out, int64_t n, int k, int64_t r, int64_t d) {
  const int64_t nvec = d / VEC;
  for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    const int32_t* rt = rows + t * k;
    for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
      float acc[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int32_t id = rt[j];
        float v[VEC];
        if (id >= 0 && id < r)
          load_vec<T, VEC>(y + int64_t(id) * d + c * VEC, v);
        else
          fill_nan(v);
        const float g = GATES ? gates[t * k + j] : 1.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] += g * v[i];
      }
      store_vec<T, VEC>(out + t * d + c * VEC, acc);
    }
  }
}

/// For token row t, for each j in order: dy[rows[t, j]] = g[t, j] · dout[t] and dgates[t, j] =
/// dout[t] · y[rows[t, j]] (block-wide f32 sum, fixed tree). One block per token row; no two
/// blocks write one dy row because every dy row appears once in rows. A row index outside
/// [0, R) writes no dy row and makes its dgates entry NaN.
template <class T, int VEC>
__global__ void __launch_bounds__(kColThreads)
    moe_combine_backward_kernel(const T* __restrict__ dout, const T* __restrict__ y, const int32_t* __restrict__ rows,
                                const float* __restrict__ gates, T* __restrict__ dy, float* __restrict__ dgates,
                                int64_t n, int k, int64_t r, int64_t d) {
  __shared__ float sh[32];
  const int64_t nvec = d / VEC;
  for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    const T* go = dout + t * d;
    for (int j = 0; j < k; ++j) {
      const int32_t id = rows[t * k + j];
      const bool ok = id >= 0 && id < r;  // uniform over the block: block_sum below is reached by all
      const float w = gates[t * k + j];
      float dot = 0.0f;
      if (ok) {
        const T* yr = y + int64_t(id) * d;
        T* dyr = dy + int64_t(id) * d;
        for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
          float gv[VEC], yv[VEC], o[VEC];
          load_vec<T, VEC>(go + c * VEC, gv);
          load_vec<T, VEC>(yr + c * VEC, yv);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            dot += gv[i] * yv[i];
            o[i] = w * gv[i];
          }
          store_vec<T, VEC>(dyr + c * VEC, o);
        }
      }
      dot = block_sum(dot, sh);
      if (threadIdx.x == 0) dgates[t * k + j] = ok ? dot : NAN;
    }
  }
}

// ---- argument checks (messages as the CPU reference's) ----

/// @throws std::invalid_argument unless t is defined, [rows, cols] and of dtype dt.
void check_2d(const Tensor& t, int64_t rows, int64_t cols, DType dt, const char* kernel, const char* name) {
  require_defined(t, kernel, name);
  require(t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols, kernel,
          std::string(name) + " " + shape_str(t.shape()) + " is not [" + std::to_string(rows) + ", " +
              std::to_string(cols) + "]");
  require_dtype(t, dt, kernel, name);
}

/// @throws std::invalid_argument unless t is a defined 2-D tensor (the operand that sets the
/// shapes of a call).
void check_matrix(const Tensor& t, const char* kernel, const char* name) {
  require_defined(t, kernel, name);
  require(t.ndim() == 2, kernel, std::string(name) + " must be 2-D, got " + shape_str(t.shape()));
}

/// The index of a row of E (or R, or N) entries must fit the kernels' int arithmetic.
void check_extent(int64_t v, const char* kernel, const char* what) {
  require(v < INT_MAX, kernel, std::string(what) + " " + std::to_string(v) + " exceeds 32-bit indices");
}

/// Whether every pointer is 16-byte aligned and rows of d elements of dt are whole vectors.
bool rows_vectorizable(int64_t d, DType dt, std::initializer_list<const void*> ps) {
  if (d % (dt == DType::kBF16 ? kVec<bf16> : kVec<float>) != 0) return false;
  return std::all_of(ps.begin(), ps.end(), [](const void* p) { return aligned16(p); });
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

}  // namespace

/// Router forward on logits f32 [N, E]: scores f32 [N, E], topk i32 [N, k] (chosen when
/// `select`, else read), gates f32 [N, k]; bias f32 [E] or undefined. One warp per row.
/// With select = false, a topk entry outside [0, E) gives NaN gates for its row.
/// @throws std::invalid_argument on shapes, dtypes or top_k outside [1, E].
void CudaDevice::moe_router_forward(const Tensor& logits, const Tensor& bias, const MoeRouting& r, bool select,
                                    const Tensor& scores, const Tensor& topk, const Tensor& gates) {
  constexpr const char* kn = "moe_router_forward";
  check_matrix(logits, kn, "logits");
  require_dtype(logits, DType::kF32, kn, "logits");
  const int64_t n = logits.dim(0), e = logits.dim(1), k = r.top_k;
  require(k >= 1 && k <= e, kn, "top_k " + std::to_string(k) + " outside [1, " + std::to_string(e) + "]");
  check_extent(e, kn, "expert count");
  check_2d(scores, n, e, DType::kF32, kn, "scores");
  check_2d(topk, n, k, DType::kI32, kn, "topk");
  check_2d(gates, n, k, DType::kF32, kn, "gates");
  if (bias.defined()) {
    require(bias.numel() == e, kn,
            "bias of " + std::to_string(bias.numel()) + " values for " + std::to_string(e) + " experts");
    require_dtype(bias, DType::kF32, kn, "bias");
  }
  if (n == 0) return;
  const float* bp = bias.defined() ? bias.f32() : nullptr;
  const bool sig = r.score_func == MoeScoreFunc::kSigmoid;
  if (select)
    moe_router_forward_kernel<true><<<warp_rows_grid(n), kRowThreads, 0, compute_>>>(
        logits.f32(), bp, n, e, int(k), sig, r.route_norm, r.route_scale, scores.f32(), topk.i32(), gates.f32());
  else
    moe_router_forward_kernel<false><<<warp_rows_grid(n), kRowThreads, 0, compute_>>>(
        logits.f32(), bp, n, e, int(k), sig, r.route_norm, r.route_scale, scores.f32(), topk.i32(), gates.f32());
  MT_CUDA_LAUNCH("moe_router_forward_kernel");
}

/// Router backward: dlogits f32 [N, E] (overwritten) from dgates f32 [N, k], the forward's
/// scores f32 [N, E] and topk i32 [N, k], and dscores_extra f32 [N, E] or undefined (may alias
/// dlogits). One warp per row; a topk entry outside [0, E) makes its row NaN.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::moe_router_backward(const Tensor& dgates, const Tensor& scores, const Tensor& topk,
                                     const MoeRouting& r, const Tensor& dscores_extra, const Tensor& dlogits) {
  constexpr const char* kn = "moe_router_backward";
  check_matrix(scores, kn, "scores");
  require_dtype(scores, DType::kF32, kn, "scores");
  const int64_t n = scores.dim(0), e = scores.dim(1), k = r.top_k;
  require(k >= 0 && k < INT_MAX, kn, "top_k " + std::to_string(k) + " out of range");
  check_extent(e, kn, "expert count");
  check_2d(dgates, n, k, DType::kF32, kn, "dgates");
  check_2d(topk, n, k, DType::kI32, kn, "topk");
  check_2d(dlogits, n, e, DType::kF32, kn, "dlogits");
  if (dscores_extra.defined()) check_2d(dscores_extra, n, e, DType::kF32, kn, "dscores_extra");
  if (n == 0 || e == 0) return;
  moe_router_backward_kernel<<<warp_rows_grid(n), kRowThreads, 0, compute_>>>(
      dgates.f32(), scores.f32(), topk.i32(), dscores_extra.defined() ? dscores_extra.f32() : nullptr, n, e, int(k),
      r.score_func == MoeScoreFunc::kSigmoid, r.route_norm, r.route_scale, dlogits.f32());
  MT_CUDA_LAUNCH("moe_router_backward_kernel");
}

/// Router z-loss of logits f32 [N, E]: returns Σ_n lse_n² (fp64; per-row values summed by the
/// fixed-order reduce.cuh kernel, so reproducible); dlogits f32 [N, E] (may alias logits)
/// accumulates grad_scale · 2·lse_n·softmax when defined. One warp per row. Synchronizes the
/// compute stream. @throws std::invalid_argument on shapes or dtypes; std::out_of_range when an
/// earlier kernel flagged a bad token id (as every synchronizing call).
double CudaDevice::moe_z_loss(const Tensor& logits, float grad_scale, const Tensor& dlogits) {
  constexpr const char* kn = "moe_z_loss";
  check_matrix(logits, kn, "logits");
  require_dtype(logits, DType::kF32, kn, "logits");
  const int64_t n = logits.dim(0), e = logits.dim(1);
  if (dlogits.defined()) check_2d(dlogits, n, e, DType::kF32, kn, "dlogits");
  if (n == 0) return 0.0;
  require(e >= 1, kn, "logits have no expert column");
  double* scratch = reduce_scratch(n + 1);
  if (dlogits.defined())
    moe_z_loss_kernel<true>
        <<<warp_rows_grid(n), kRowThreads, 0, compute_>>>(logits.f32(), n, e, grad_scale, dlogits.f32(), scratch);
  else
    moe_z_loss_kernel<false>
        <<<warp_rows_grid(n), kRowThreads, 0, compute_>>>(logits.f32(), n, e, grad_scale, nullptr, scratch);
  MT_CUDA_LAUNCH("moe_z_loss_kernel");
  launch_sum_doubles(scratch, n, scratch + n, compute_);
  MT_CUDA(cudaMemcpyAsync(host_scratch_, scratch + n, sizeof(double), cudaMemcpyDeviceToHost, compute_));
  MT_CUDA(cudaStreamSynchronize(compute_));
  const double total = host_scratch_[0];
  check_error_flag();
  return total;
}

/// Balance-loss sums f32 [S, E] (overwritten) from scores f32 [N, E] and sample i32 [N]:
/// per-chunk partials of 256 rows, one thread per (chunk, sample, expert), then the chunks in
/// order (N·S·E compares, a temporary of ⌈N/256⌉·S·E floats when N > 256; sigmoid first
/// computes per-row normalizers, one warp per row). Deterministic; rounding differs from the
/// CPU's strict row order only by the chunking. A sample id outside [0, S) contributes nothing.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::moe_aux_stats(const Tensor& scores, const Tensor& sample, MoeScoreFunc f, const Tensor& sums) {
  constexpr const char* kn = "moe_aux_stats";
  check_matrix(scores, kn, "scores");
  require_dtype(scores, DType::kF32, kn, "scores");
  check_matrix(sums, kn, "sums");
  const int64_t n = scores.dim(0), e = scores.dim(1), s_count = sums.dim(0);
  require_defined(sample, kn, "sample");
  require(sample.numel() == n, kn,
          std::to_string(sample.numel()) + " sample ids for " + std::to_string(n) + " rows");
  require_dtype(sample, DType::kI32, kn, "sample");
  check_2d(sums, s_count, e, DType::kF32, kn, "sums");
  const int64_t se = s_count * e;
  if (se == 0) return;
  if (n == 0) {
    MT_CUDA(cudaMemsetAsync(sums.raw(), 0, sums.nbytes(), compute_));
    return;
  }
  const bool sig = f == MoeScoreFunc::kSigmoid;
  const int64_t chunks = ceil_div(n, kAuxChunk);
  const int64_t temp_n = (sig ? n : 0) + (chunks > 1 ? chunks * se : 0);
  Tensor temp;
  if (temp_n > 0) temp = Tensor::empty(allocator(), {temp_n}, DType::kF32, MemCategory::kTemporaries);
  float* rowsum = sig ? temp.f32() : nullptr;
  float* partial = chunks > 1 ? temp.f32() + (sig ? n : 0) : sums.f32();
  if (sig) {
    moe_row_sum_kernel<<<warp_rows_grid(n), kRowThreads, 0, compute_>>>(scores.f32(), n, e, rowsum);
    MT_CUDA_LAUNCH("moe_row_sum_kernel");
  }
  moe_aux_partial_kernel<<<grid_for(chunks * se, 256), 256, 0, compute_>>>(scores.f32(), sample.i32(), rowsum, n, e,
                                                                          s_count, chunks, partial);
  MT_CUDA_LAUNCH("moe_aux_partial_kernel");
  if (chunks > 1) {
    moe_aux_chunks_kernel<<<grid_for(se, 256), 256, 0, compute_>>>(partial, chunks, se, sums.f32());
    MT_CUDA_LAUNCH("moe_aux_chunks_kernel");
  }
}

/// Balance-loss gradient: dscores f32 [N, E] (overwritten) from coef f32 [S, E], sample i32
/// [N] and scores f32 [N, E]. One warp per row; a sample id outside [0, S) makes its row NaN.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::moe_aux_backward(const Tensor& coef, const Tensor& sample, const Tensor& scores, MoeScoreFunc f,
                                  const Tensor& dscores) {
  constexpr const char* kn = "moe_aux_backward";
  check_matrix(scores, kn, "scores");
  require_dtype(scores, DType::kF32, kn, "scores");
  const int64_t n = scores.dim(0), e = scores.dim(1);
  require_defined(sample, kn, "sample");
  require(sample.numel() == n, kn,
          std::to_string(sample.numel()) + " sample ids for " + std::to_string(n) + " rows");
  require_dtype(sample, DType::kI32, kn, "sample");
  require_defined(coef, kn, "coef");
  require(coef.ndim() == 2 && coef.dim(1) == e, kn,
          "coef " + shape_str(coef.shape()) + " is not [S, " + std::to_string(e) + "]");
  require_dtype(coef, DType::kF32, kn, "coef");
  check_2d(dscores, n, e, DType::kF32, kn, "dscores");
  if (n == 0 || e == 0) return;
  moe_aux_backward_kernel<<<warp_rows_grid(n), kRowThreads, 0, compute_>>>(
      coef.f32(), sample.i32(), scores.f32(), n, e, coef.dim(0), f == MoeScoreFunc::kSigmoid, dscores.f32());
  MT_CUDA_LAUNCH("moe_aux_backward_kernel");
}

/// dst [R, D] = src [N, D] rows index i32 [R] (f32 or bf16, one dtype; a copy, exact). One block
/// per dst row. Indices are not checked on the host (the caller builds them; checking would
/// synchronize): unlike CpuDevice's std::out_of_range, an index outside [0, N) yields a NaN row.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::gather_rows(const Tensor& src, const Tensor& index, const Tensor& dst) {
  constexpr const char* kn = "gather_rows";
  check_matrix(src, kn, "src");
  require_float(src, kn, "src");
  require_defined(index, kn, "index");
  require_dtype(index, DType::kI32, kn, "index");
  const int64_t n = src.dim(0), d = src.dim(1), r = index.numel();
  require_defined(dst, kn, "dst");
  require(src.dtype() == dst.dtype(), kn, "src and dst dtypes differ");
  check_2d(dst, r, d, dst.dtype(), kn, "dst");
  if (r == 0 || d == 0) return;
  const bool vec = rows_vectorizable(d, src.dtype(), {src.raw(), dst.raw()});
  MT_DISPATCH_FLOAT(src.dtype(), T, {
    constexpr int V = kVec<T>;
    if (vec)
      gather_rows_kernel<T, V><<<block_rows_grid(r), col_threads(d / V), 0, compute_>>>(ptr<T>(src), index.i32(),
                                                                                       ptr<T>(dst), r, n, d);
    else
      gather_rows_kernel<T, 1><<<block_rows_grid(r), col_threads(d), 0, compute_>>>(ptr<T>(src), index.i32(),
                                                                                  ptr<T>(dst), r, n, d);
    MT_CUDA_LAUNCH("gather_rows_kernel");
  });
}

namespace {
struct CombineExtents {
  int64_t r, d, n, k;
};
// The operand checks moe_combine and its backward share: y [R, D] f32 or bf16, rows i32 [N, k].
// @throws std::invalid_argument naming the kernel.
CombineExtents combine_extents(const Tensor& y, const Tensor& rows, const char* kn) {
  check_matrix(y, kn, "y");
  require_float(y, kn, "y");
  check_matrix(rows, kn, "rows");
  require_dtype(rows, DType::kI32, kn, "rows");
  check_extent(rows.dim(1), kn, "top_k");
  return {y.dim(0), y.dim(1), rows.dim(0), rows.dim(1)};
}
}  // namespace

/// out [N, D] = Σ_j gates[n, j] · y[rows[n, j]] (y [R, D], out in y's dtype, f32 or bf16; rows
/// i32 [N, k]; gates f32 [N, k] or undefined = ones), f32 accumulation in j order. One block per
/// token row; a row index outside [0, R) makes its out row NaN.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::moe_combine(const Tensor& y, const Tensor& rows, const Tensor& gates, const Tensor& out) {
  constexpr const char* kn = "moe_combine";
  const CombineExtents ext = combine_extents(y, rows, kn);
  const int64_t r = ext.r, d = ext.d, n = ext.n, k = ext.k;
  check_2d(out, n, d, y.dtype(), kn, "out");
  if (gates.defined()) check_2d(gates, n, k, DType::kF32, kn, "gates");
  if (n == 0 || d == 0) return;
  const bool vec = rows_vectorizable(d, y.dtype(), {y.raw(), out.raw()});
  const float* gp = gates.defined() ? gates.f32() : nullptr;
  MT_DISPATCH_FLOAT(y.dtype(), T, {
    constexpr int V = kVec<T>;
    const T* yp = ptr<T>(y);
    T* op = ptr<T>(out);
    const unsigned grid = block_rows_grid(n);
    if (vec && gp)
      moe_combine_kernel<T, V, true><<<grid, col_threads(d / V), 0, compute_>>>(yp, rows.i32(), gp, op, n, int(k), r, d);
    else if (vec)
      moe_combine_kernel<T, V, false><<<grid, col_threads(d / V), 0, compute_>>>(yp, rows.i32(), gp, op, n, int(k), r,
                                                                                d);
    else if (gp)
      moe_combine_kernel<T, 1, true><<<grid, col_threads(d), 0, compute_>>>(yp, rows.i32(), gp, op, n, int(k), r, d);
    else
      moe_combine_kernel<T, 1, false><<<grid, col_threads(d), 0, compute_>>>(yp, rows.i32(), gp, op, n, int(k), r, d);
    MT_CUDA_LAUNCH("moe_combine_kernel");
  });
}

/// Backward of moe_combine with gates: dy [R, D] (overwritten, dout's dtype; every row must
/// appear once in rows, or it is left unwritten) = g[n, j] · dout[n] at rows[n, j], and dgates
/// f32 [N, k] = dout[n] · y[rows[n, j]] (f32 accumulation, fixed block tree). dout [N, D], y
/// [R, D] f32 or bf16 (one dtype); rows i32 [N, k]; gates f32 [N, k]. One block per token row;
/// a row index outside [0, R) writes no dy row and gives a NaN dgates entry.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::moe_combine_backward(const Tensor& dout, const Tensor& y, const Tensor& rows, const Tensor& gates,
                                      const Tensor& dy, const Tensor& dgates) {
  constexpr const char* kn = "moe_combine_backward";
  const CombineExtents ext = combine_extents(y, rows, kn);
  const int64_t r = ext.r, d = ext.d, n = ext.n, k = ext.k;
  check_2d(dout, n, d, y.dtype(), kn, "dout");
  check_2d(gates, n, k, DType::kF32, kn, "gates");
  check_2d(dgates, n, k, DType::kF32, kn, "dgates");
  check_2d(dy, r, d, y.dtype(), kn, "dy");
  if (n == 0 || k == 0) return;
  const bool vec = rows_vectorizable(d, y.dtype(), {dout.raw(), y.raw(), dy.raw()});
  MT_DISPATCH_FLOAT(y.dtype(), T, {
    constexpr int V = kVec<T>;
    const unsigned grid = block_rows_grid(n);
    if (vec)
      moe_combine_backward_kernel<T, V><<<grid, col_threads(d / V), 0, compute_>>>(
          ptr<T>(dout), ptr<T>(y), rows.i32(), gates.f32(), ptr<T>(dy), dgates.f32(), n, int(k), r, d);
    else
      moe_combine_backward_kernel<T, 1><<<grid, col_threads(d), 0, compute_>>>(
          ptr<T>(dout), ptr<T>(y), rows.i32(), gates.f32(), ptr<T>(dy), dgates.f32(), n, int(k), r, d);
    MT_CUDA_LAUNCH("moe_combine_backward_kernel");
  });
}

}  // namespace meshtrain
