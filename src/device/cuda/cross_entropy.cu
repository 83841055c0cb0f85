// CUDA kernels: softmax cross-entropy over the full vocabulary with the fused gradient, and the
// three steps of the vocab-parallel loss (Megatron-LM, Shoeybi et al. 2019 §3).
//
// One block per row. Pass 1 reads the row once, each thread keeping an online (max, Σ exp)
// pair in f32 over its slice (Milakov & Gimelshein 2018, "Online normalizer calculation for
// softmax"), merged over the block; pass 2 (when a gradient is wanted) re-reads the row and
// writes grad_scale · (softmax − onehot) in the logits' dtype. Probabilities are never stored.
// Losses are per-row fp64 values summed by a fixed-order kernel (reduce.cuh), so the returned
// sum is reproducible.
#include <algorithm>
#include <climits>
#include <cmath>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/reduce.cuh"
#include "device/cuda/vec_io.cuh"

namespace meshtrain {

namespace {
using namespace cuda;

constexpr int kCeThreads = 512;
constexpr int64_t kMaxGrid = 1 << 20;
constexpr float kLog2e = 1.4426950408889634f;

/// e^(x − m) through the exp2 unit (a few ulp: well inside the f32 tolerance, and it keeps the
/// 1e9-element passes memory-bound rather than bound by the slower accurate expf).
__device__ __forceinline__ float exp_diff(float x, float m) { return exp2f((x - m) * kLog2e); }

/// Calls f(c, v) for every vector c of this thread's strided slice of row [nvec · VEC], v the
/// VEC values widened to f32. Four vectors are loaded before any is used, to keep loads in
/// flight. f may write row element c·VEC + i after reading it (that is what aliasing needs).
template <class T, int VEC, class F>
__device__ __forceinline__ void row_foreach(const T* row, int64_t nvec, F&& f) {
  const int64_t step = blockDim.x;
  int64_t c = threadIdx.x;
  for (; c + 3 * step < nvec; c += 4 * step) {
    float v[4][VEC];
#pragma unroll
    for (int u = 0; u < 4; ++u) load_vec<T, VEC>(row + (c + u * step) * VEC, v[u]);
#pragma unroll
    for (int u = 0; u < 4; ++u) f(c + u * step, v[u]);
  }
  for (; c < nvec; c += step) {
    float v[VEC];
    load_vec<T, VEC>(row + c * VEC, v);
    f(c, v);
  }
}

/// M = max of row [nvec · VEC], S = Σ e^(x − M) (f32), for the whole block (every thread gets
/// them). Online per thread, then merged: S = Σ_threads s_t · e^(m_t − M).
template <class T, int VEC>
__device__ __forceinline__ void row_max_sumexp(const T* row, int64_t nvec, float* sh, float& M, float& S) {
  float m = -INFINITY, s = 0.0f;
  row_foreach<T, VEC>(row, nvec, [&](int64_t, const float (&v)[VEC]) {
    float vm = v[0];
#pragma unroll
    for (int i = 1; i < VEC; ++i) vm = fmaxf(vm, v[i]);
    if (vm > m) {
      s *= exp_diff(m, vm);  // 0 while m is still −inf
      m = vm;
    }
    if (m != -INFINITY)  // all −inf so far: every term is 0 (and −inf − −inf would be NaN)
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += exp_diff(v[i], m);
  });
  M = block_max(m, sh);
  S = block_sum(m == -INFINITY ? 0.0f : s * exp_diff(m, M), sh);
}

/// g[c·VEC + i] = grad_scale · e^(x − lse) − (grad_scale where the column is `onehot`), for
/// one vector (onehot = −1 or out of range: no subtraction).
template <class T, int VEC>
__device__ __forceinline__ void store_softmax_grad(T* g, int64_t c, const float (&x)[VEC], float lse,
                                                   float grad_scale, int64_t onehot, float p_scale) {
  float o[VEC];
  const int64_t rel = onehot - c * VEC;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    o[i] = p_scale * exp_diff(x[i], lse);
    if (i == rel) o[i] -= grad_scale;
  }
  store_vec<T, VEC>(g + c * VEC, o);
}

/// Full-vocabulary loss: row_loss[r] = lse_r − x[r, t_r] (fp64); with GRAD, dlogits[r] =
/// grad_scale · (softmax − onehot). Targets outside [0, V) set the error flag (loss 0, no onehot).
/// The target logit is read before pass 2 may overwrite it (dlogits may alias logits).
template <class T, int VEC, bool GRAD>
__global__ void __launch_bounds__(kCeThreads)
    cross_entropy_kernel(const T* logits, const int32_t* __restrict__ targets, T* dlogits, int64_t n, int64_t v,
                         float grad_scale, double* __restrict__ row_loss, int* flag) {
  __shared__ float sh[32];
  const int64_t nvec = v / VEC;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* x = logits + r * v;
    const int tgt = targets[r];
    const bool ok = tgt >= 0 && tgt < v;
    float xt = 0.0f;
    if (threadIdx.x == 0) {
      if (ok)
        xt = to_f<T>(x[tgt]);
      else
        flag_bad_id(flag, tgt);
    }
    float M, S;
    row_max_sumexp<T, VEC>(x, nvec, sh, M, S);  // its barriers order the read of x[tgt] before pass 2
    const float lse = M + logf(S);
    if (threadIdx.x == 0) row_loss[r] = ok ? double(lse) - double(xt) : 0.0;
    if constexpr (GRAD) {
      T* g = dlogits + r * v;
      const int64_t onehot = ok ? tgt : -1;
      row_foreach<T, VEC>(x, nvec, [&](int64_t c, const float (&xv)[VEC]) {
        store_softmax_grad<T, VEC>(g, c, xv, lse, grad_scale, onehot, grad_scale);
      });
    }
  }
}

/// Vocab-parallel step 1: stats[r] = {M, S, x[r, t_r − vocab_start] or 0} for this shard's
/// columns; targets outside [0, vocab_size) set the error flag.
template <class T, int VEC>
__global__ void __launch_bounds__(kCeThreads)
    cross_entropy_partial_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets, int64_t n,
                                 int64_t v, int64_t vocab_start, int64_t vocab_size, float* __restrict__ stats,
                                 int* flag) {
  __shared__ float sh[32];
  const int64_t nvec = v / VEC;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* x = logits + r * v;
    const int tgt = targets[r];
    const int64_t col = int64_t(tgt) - vocab_start;
    float xt = 0.0f;
    if (threadIdx.x == 0) {
      if (tgt < 0 || tgt >= vocab_size) flag_bad_id(flag, tgt);
      if (col >= 0 && col < v) xt = to_f<T>(x[col]);
    }
    float M, S;
    row_max_sumexp<T, VEC>(x, nvec, sh, M, S);
    if (threadIdx.x == 0) {
      stats[3 * r] = M;
      stats[3 * r + 1] = S;
      stats[3 * r + 2] = xt;
    }
  }
}

/// Vocab-parallel step 2, one thread per row: lse[i] = M + log Σ_p s_p·e^(m_p − M) over the
/// shards p in rank order, row_loss[i] = lse[i] − Σ_p target_p (fp64), as the CPU reference.
__global__ void cross_entropy_combine_kernel(const float* __restrict__ st, int64_t p, int64_t n,
                                             float* __restrict__ lse, double* __restrict__ row_loss) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float mx = st[3 * i];
    for (int64_t r = 1; r < p; ++r) mx = fmaxf(mx, st[(r * n + i) * 3]);
    float sum = 0.0f, target = 0.0f;
    for (int64_t r = 0; r < p; ++r) {
      const float* s = st + (r * n + i) * 3;
      sum += s[1] * expf(s[0] - mx);
      target += s[2];  // only the shard holding the target contributes a non-zero value
    }
    const float l = mx + logf(sum);
    lse[i] = l;
    row_loss[i] = double(l) - double(target);
  }
}

/// Vocab-parallel step 3: dlogits[r] = grad_scale · (e^(x − lse[r]) − onehot) over this shard's
/// columns. dlogits may alias logits (each element read, then written, by one thread).
template <class T, int VEC>
__global__ void __launch_bounds__(kCeThreads)
    cross_entropy_grad_kernel(const T* logits, const int32_t* __restrict__ targets, int64_t vocab_start,
                              const float* __restrict__ lse, T* dlogits, int64_t n, int64_t v, float grad_scale,
                              float z_loss_coeff) {
  const int64_t nvec = v / VEC;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t col = int64_t(targets[r]) - vocab_start;
    const int64_t onehot = col >= 0 && col < v ? col : -1;
    const float l = lse[r];
    const float p_scale = grad_scale * (1.0f + 2.0f * z_loss_coeff * l);  // PaLM's z-loss: ∂(ζ·lse²) = 2ζ·lse·softmax
    T* g = dlogits + r * v;
    row_foreach<T, VEC>(logits + r * v, nvec, [&](int64_t c, const float (&xv)[VEC]) {
      store_softmax_grad<T, VEC>(g, c, xv, l, grad_scale, onehot, p_scale);
    });
  }
}

/// Threads per row block: whole warps, at most kCeThreads.
int ce_threads(int64_t nvec) { return std::min<int>(kCeThreads, round_up_warp(nvec)); }
unsigned ce_grid(int64_t n) { return unsigned(std::min(n, kMaxGrid)); }

/// Validates logits [N, V] (f32 / bf16), targets i32 [N] and, when defined, dlogits (logits'
/// dtype and shape). @throws std::invalid_argument.
void check_logits(const char* k, const Tensor& logits, const Tensor& targets, const Tensor* dlogits) {
  require_defined(logits, k, "logits");
  require_defined(targets, k, "targets");
  require(logits.ndim() == 2, k, "logits must be [N, V], got " + shape_str(logits.shape()));
  require_float(logits, k, "logits");
  require_dtype(targets, DType::kI32, k, "targets");
  require_numel(targets, logits.dim(0), k, "targets");
  require(logits.dim(1) > 0 && logits.dim(1) < INT_MAX, k, "vocabulary size out of range");
  if (dlogits && dlogits->defined()) {
    require_same(*dlogits, logits, k);
    require(dlogits->shape() == logits.shape(), k,
            "dlogits " + shape_str(dlogits->shape()) + " must match logits " + shape_str(logits.shape()));
  }
}

/// Whether rows of v elements of dtype dt can be read as 16-byte vectors from every pointer.
bool rows_vectorizable(int64_t v, DType dt, std::initializer_list<const void*> ps) {
  if (v % (dt == DType::kBF16 ? kVec<bf16> : kVec<float>) != 0) return false;
  return std::all_of(ps.begin(), ps.end(), [](const void* p) { return aligned16(p); });
}

}  // namespace

/// Σ_n (lse_n − logits[n, t_n]) in nats (fp64) of logits [N, V] (f32 or bf16) against targets
/// i32 [N]; when dlogits is defined ([N, V], logits' dtype, may alias logits) it is overwritten
/// with grad_scale · (softmax − onehot). Synchronizes the compute stream (the loss is returned).
/// @throws std::out_of_range for a target outside [0, V) (or an earlier kernel's bad id);
/// std::invalid_argument on shapes or dtypes.
double CudaDevice::cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                                 float grad_scale) {
  constexpr const char* k = "cross_entropy";
  check_logits(k, logits, targets, &dlogits);
  const int64_t n = logits.dim(0), v = logits.dim(1);
  if (n == 0) return 0.0;
  double* scratch = reduce_scratch(n + 1);
  const bool grad = dlogits.defined();
  const bool vec = rows_vectorizable(v, logits.dtype(), {logits.raw(), grad ? dlogits.raw() : logits.raw()});
  MT_DISPATCH_FLOAT(logits.dtype(), T, {
    const T* x = static_cast<const T*>(logits.raw());
    T* g = grad ? static_cast<T*>(dlogits.raw()) : nullptr;
    constexpr int V = kVec<T>;
    const int threads = ce_threads(vec ? v / V : v);
    if (vec && grad)
      cross_entropy_kernel<T, V, true>
          <<<ce_grid(n), threads, 0, compute_>>>(x, targets.i32(), g, n, v, grad_scale, scratch, error_flag_);
    else if (vec)
      cross_entropy_kernel<T, V, false>
          <<<ce_grid(n), threads, 0, compute_>>>(x, targets.i32(), g, n, v, grad_scale, scratch, error_flag_);
    else if (grad)
      cross_entropy_kernel<T, 1, true>
          <<<ce_grid(n), threads, 0, compute_>>>(x, targets.i32(), g, n, v, grad_scale, scratch, error_flag_);
    else
      cross_entropy_kernel<T, 1, false>
          <<<ce_grid(n), threads, 0, compute_>>>(x, targets.i32(), g, n, v, grad_scale, scratch, error_flag_);
    MT_CUDA_LAUNCH("cross_entropy_kernel");
  });
  launch_sum_doubles(scratch, n, scratch + n, compute_);
  MT_CUDA(cudaMemcpyAsync(host_scratch_, scratch + n, sizeof(double), cudaMemcpyDeviceToHost, compute_));
  MT_CUDA(cudaStreamSynchronize(compute_));
  check_error_flag();
  return host_scratch_[0];
}

/// Step 1 of the vocab-parallel loss on this shard's logits [N, V_local] (columns [vocab_start,
/// vocab_start + V_local)): stats f32 [N, 3] = {max, Σ e^(x − max), target logit or 0}.
/// Asynchronous: a target outside [0, vocab_size) sets the error flag and the next
/// synchronizing call (e.g. cross_entropy_combine) throws std::out_of_range.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                       int64_t vocab_size, const Tensor& stats) {
  constexpr const char* k = "cross_entropy_partial";
  check_logits(k, logits, targets, nullptr);
  require_defined(stats, k, "stats");
  require_dtype(stats, DType::kF32, k, "stats");
  const int64_t n = logits.dim(0), v = logits.dim(1);
  require_numel(stats, 3 * n, k, "stats");
  if (n == 0) return;
  const bool vec = rows_vectorizable(v, logits.dtype(), {logits.raw()});
  MT_DISPATCH_FLOAT(logits.dtype(), T, {
    const T* x = static_cast<const T*>(logits.raw());
    constexpr int V = kVec<T>;
    if (vec)
      cross_entropy_partial_kernel<T, V><<<ce_grid(n), ce_threads(v / V), 0, compute_>>>(
          x, targets.i32(), n, v, vocab_start, vocab_size, stats.f32(), error_flag_);
    else
      cross_entropy_partial_kernel<T, 1><<<ce_grid(n), ce_threads(v), 0, compute_>>>(
          x, targets.i32(), n, v, vocab_start, vocab_size, stats.f32(), error_flag_);
    MT_CUDA_LAUNCH("cross_entropy_partial_kernel");
  });
}

/// Step 2: lse f32 [N] from stats_all f32 [P, N, 3] (rank order); returns Σ_n (lse_n −
/// Σ_p target_p[n]) in nats (fp64, fixed order: identical on every rank given identical
/// stats_all). Synchronizes the compute stream. @throws std::out_of_range when a kernel flagged
/// a bad id (e.g. cross_entropy_partial's targets); std::invalid_argument on shapes or dtypes.
double CudaDevice::cross_entropy_combine(const Tensor& stats_all, const Tensor& lse) {
  constexpr const char* k = "cross_entropy_combine";
  require_defined(stats_all, k, "stats_all");
  require_defined(lse, k, "lse");
  require(stats_all.ndim() == 3 && stats_all.dim(2) == 3, k,
          "stats_all must be [P, N, 3], got " + shape_str(stats_all.shape()));
  require_dtype(stats_all, DType::kF32, k, "stats_all");
  require_dtype(lse, DType::kF32, k, "lse");
  const int64_t p = stats_all.dim(0), n = stats_all.dim(1);
  require(p >= 1, k, "stats_all has no shard");
  require_numel(lse, n, k, "lse");
  if (n == 0) return 0.0;
  double* scratch = reduce_scratch(n + 1);
  cross_entropy_combine_kernel<<<grid_for(n, 256), 256, 0, compute_>>>(stats_all.f32(), p, n, lse.f32(), scratch);
  MT_CUDA_LAUNCH("cross_entropy_combine_kernel");
  launch_sum_doubles(scratch, n, scratch + n, compute_);
  MT_CUDA(cudaMemcpyAsync(host_scratch_, scratch + n, sizeof(double), cudaMemcpyDeviceToHost, compute_));
  MT_CUDA(cudaStreamSynchronize(compute_));
  check_error_flag();
  return host_scratch_[0];
}

/// Step 3: dlogits [N, V_local] (logits' dtype, may alias logits) = grad_scale · ((1 + 2ζ·lse[n])·
/// e^(x − lse[n]) − onehot(target − vocab_start)) over this shard's columns, ζ = z_loss_coeff
/// (PaLM's z-loss); lse f32 [N]. Targets outside the shard get no onehot.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::cross_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const Tensor& lse, const Tensor& dlogits, float grad_scale, float z_loss_coeff) {
  constexpr const char* k = "cross_entropy_grad";
  check_logits(k, logits, targets, &dlogits);
  require_defined(dlogits, k, "dlogits");
  require_defined(lse, k, "lse");
  require_dtype(lse, DType::kF32, k, "lse");
  const int64_t n = logits.dim(0), v = logits.dim(1);
  require_numel(lse, n, k, "lse");
  if (n == 0) return;
  const bool vec = rows_vectorizable(v, logits.dtype(), {logits.raw(), dlogits.raw()});
  MT_DISPATCH_FLOAT(logits.dtype(), T, {
    const T* x = static_cast<const T*>(logits.raw());
    T* g = static_cast<T*>(dlogits.raw());
    constexpr int V = kVec<T>;
    if (vec)
      cross_entropy_grad_kernel<T, V><<<ce_grid(n), ce_threads(v / V), 0, compute_>>>(
          x, targets.i32(), vocab_start, lse.f32(), g, n, v, grad_scale, z_loss_coeff);
    else
      cross_entropy_grad_kernel<T, 1><<<ce_grid(n), ce_threads(v), 0, compute_>>>(x, targets.i32(), vocab_start,
                                                                                   lse.f32(), g, n, v, grad_scale,
                                                                                   z_loss_coeff);
    MT_CUDA_LAUNCH("cross_entropy_grad_kernel");
  });
}

}  // namespace meshtrain
