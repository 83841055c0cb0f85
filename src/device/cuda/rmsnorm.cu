// CUDA kernels: RMSNorm (Zhang & Sennrich 2019) forward and backward, the residual add fused
// into the forward, and the residual gradient fused into the backward.
//
// Layout of the row kernels: a block is tx × ty ≤ 256 threads, ty rows at a time, tx threads
// (whole warps) per row, each thread holding ITEMS vectors of VEC elements of its row in
// registers (ITEMS · VEC ≤ 32, so D ≤ 8192 for the vectorized paths), so a row is read from
// memory once. Longer rows go to the streaming kernels, which read the row twice.
//
// The weight gradient is deterministic without atomics: each of the G backward blocks
// accumulates its rows' dw contribution in registers, reduces its ty row slots in shared
// memory in a fixed order and writes one row of a temporary [G, D] f32; a second kernel sums
// those partials in a fixed order into dw.
//
// A split backward (zero-bubble pipeline schedules, Qi et al. 2023) runs the backward kernels
// twice with one part each (BackwardPart): dx now, dw later. Both parts keep the fused
// kernel's block shape, grid and arithmetic, so dx and dw come out bitwise as fused (for dw,
// see kWeightGrid for the one configuration where the two fused variants' grids differ).
#include <algorithm>
#include <climits>
#include <type_traits>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/vec_io.cuh"

namespace meshtrain {

namespace {
using namespace cuda;

constexpr int kRowThreads = 256;     // tx · ty of the register kernels
constexpr int kMaxRowsPerBlock = 8;  // ty ≤ 8 (rows of ≤ 32 vectors share a block)
constexpr int kMaxRowFloats = 32;    // ITEMS · VEC: registers per held row array
constexpr int kSlotFloats = 2048;    // shared floats for reducing ty row slots of dw
constexpr int kStreamThreads = 1024;
constexpr int kMaxBlocksPerSm = 4;   // backward blocks per SM: enough loads in flight, few partials

/// Which outputs a backward kernel computes: both (the fused backward), dx only (a split
/// backward's input half) or dw only (its deferred weight half).
enum class BackwardPart { kAll, kInput, kWeight };
/// The fused kernel whose grid rmsnorm_backward_weight borrows (RESID = this): the block norms'
/// rmsnorm_backward_residual. The two fused variants get the same grid, hence the same dw bits,
/// wherever their occupancy (clamped to kMaxBlocksPerSm) agrees. With CUDA 13's ptxas (-v)
/// it agrees on every vectorized path for sm_80 and sm_90; it differs only on sm_90 for
/// unvectorized rows of 1025–2048 elements (79 / 75 registers without the residual, 64 with it:
/// 3 vs 4 blocks per SM), where a split non-residual norm then sums dw in another order.
constexpr bool kWeightGrid = true;

/// Block shape for rows of `nvec` vectors of `vec` elements: the fewest ITEMS (1, 2, 4, 8,
/// with ITEMS · vec ≤ 32) that covers the row with tx ≤ 256 threads; short rows share a block
/// (ty = 256 / tx, at most 8). items = 0 selects the streaming kernels. When ty > 1, ITEMS = 1
/// and tx ≤ 128, so the backward's slot reduction needs ty · tx · vec ≤ 2048 floats.
struct RowLaunch {
  int tx, ty, items;
};
RowLaunch row_launch(int64_t nvec, int vec) {
  for (int items : {1, 2, 4, 8}) {
    if (items * vec > kMaxRowFloats) break;
    const int tx = round_up_warp(ceil_div(nvec, items));
    if (tx <= kRowThreads) return {tx, std::max(1, std::min(kMaxRowsPerBlock, kRowThreads / tx)), items};
  }
  return {kStreamThreads, 1, 0};
}

/// Sum of v over the blockDim.x threads of this thread's row slot (threadIdx.y); every thread
/// of the slot gets it. `sh` holds kMaxRowsPerBlock·32 floats. Must be reached by all threads of
/// the block (it synchronizes when a row spans several warps). Fixed order: deterministic.
__device__ __forceinline__ float row_sum(float v, float* sh) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;  // uniform over the block
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float* s = sh + threadIdx.y * 32;
  __syncthreads();  // the previous call's readers are done with sh
  if (lane == 0) s[w] = v;
  __syncthreads();
  return warp_sum(lane < nw ? s[lane] : 0.0f);
}

/// rstd = 1/sqrt(mean(x²) + eps), evaluated as the CPU reference does.
__device__ __forceinline__ float inv_rms(float sum_sq, int d, float eps) { return 1.0f / sqrtf(sum_sq / float(d) + eps); }

// ---- forward ----

/// y[row] = x[row] · rstd · w, rstd[row] saved; with ADD, x is h and h += delta is stored
/// first (rounded to T, so the norm sees exactly the h that the backward will read).
/// Grid: ceil(n / ty) blocks of tx × ty threads.
template <class T, int VEC, int ITEMS, bool ADD>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(T* x, const T* delta, const T* __restrict__ w, T* y, float* __restrict__ rstd, int64_t n,
                           int d, float eps) {
  __shared__ float sh[kMaxRowsPerBlock * 32];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < n;
  const int64_t base = (valid ? row : 0) * int64_t(d);
  float v[ITEMS][VEC];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int c = (threadIdx.x + k * blockDim.x) * VEC;
    if (valid && c < d) {
      load_vec<T, VEC>(x + base + c, v[k]);
      if constexpr (ADD) {
        float dl[VEC];
        load_vec<T, VEC>(delta + base + c, dl);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[k][i] = to_f<T>(from_f<T>(v[k][i] + dl[i]));
        store_vec<T, VEC>(x + base + c, v[k]);
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss += v[k][i] * v[k][i];
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[k][i] = 0.0f;
    }
  }
  ss = row_sum(ss, sh);
  if (!valid) return;  // after the last barrier
  const float r = inv_rms(ss, d, eps);
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int c = (threadIdx.x + k * blockDim.x) * VEC;
    if (c < d) {
      float wv[VEC], o[VEC];
      load_vec<T, VEC>(w + c, wv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) o[i] = v[k][i] * r * wv[i];
      store_vec<T, VEC>(y + base + c, o);
    }
  }
}

/// The forward for long rows: one row per block (grid-stride), x read twice.
template <class T, int VEC, bool ADD>
__global__ void __launch_bounds__(kStreamThreads)
    rmsnorm_forward_stream_kernel(T* x, const T* delta, const T* __restrict__ w, T* y, float* __restrict__ rstd,
                                  int64_t n, int d, float eps) {
  __shared__ float sh[32];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    T* xr = x + row * d;
    float ss = 0.0f;
    for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
      float v[VEC];
      load_vec<T, VEC>(xr + c, v);
      if constexpr (ADD) {
        float dl[VEC];
        load_vec<T, VEC>(delta + row * d + c, dl);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = to_f<T>(from_f<T>(v[i] + dl[i]));
        store_vec<T, VEC>(xr + c, v);  // re-read below by this same thread
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss += v[i] * v[i];
    }
    ss = block_sum(ss, sh);
    const float r = inv_rms(ss, d, eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
      float v[VEC], wv[VEC];
      load_vec<T, VEC>(xr + c, v);
      load_vec<T, VEC>(w + c, wv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = v[i] * r * wv[i];
      store_vec<T, VEC>(y + row * d + c, v);
    }
  }
}

template <class T, int VEC, int ITEMS, bool ADD>
void launch_forward_items(const RowLaunch& L, T* x, const T* delta, const T* w, T* y, float* rstd, int64_t n, int d,
                          float eps, cudaStream_t s) {
  if constexpr (ITEMS * VEC <= kMaxRowFloats) {  // other combinations are never selected
    const unsigned grid = unsigned(ceil_div(n, L.ty));
    rmsnorm_forward_kernel<T, VEC, ITEMS, ADD><<<grid, dim3(L.tx, L.ty), 0, s>>>(x, delta, w, y, rstd, n, d, eps);
  }
}

/// Launches the forward for rows of d elements read VEC at a time (n < 2³¹ rows, checked).
template <class T, int VEC, bool ADD>
void launch_forward(T* x, const T* delta, const T* w, T* y, float* rstd, int64_t n, int d, float eps,
                    cudaStream_t s) {
  const RowLaunch L = row_launch(ceil_div(d, VEC), VEC);
  switch (L.items) {
    case 1: launch_forward_items<T, VEC, 1, ADD>(L, x, delta, w, y, rstd, n, d, eps, s); break;
    case 2: launch_forward_items<T, VEC, 2, ADD>(L, x, delta, w, y, rstd, n, d, eps, s); break;
    case 4: launch_forward_items<T, VEC, 4, ADD>(L, x, delta, w, y, rstd, n, d, eps, s); break;
    case 8: launch_forward_items<T, VEC, 8, ADD>(L, x, delta, w, y, rstd, n, d, eps, s); break;
    default:
      rmsnorm_forward_stream_kernel<T, VEC, ADD>
          <<<unsigned(std::min<int64_t>(n, 1 << 20)), kStreamThreads, 0, s>>>(x, delta, w, y, rstd, n, d, eps);
  }
  MT_CUDA_LAUNCH(ADD ? "add_rmsnorm_forward_kernel" : "rmsnorm_forward_kernel");
}

// ---- backward ----

/// dx[row] = rstd·(dy⊙w) − (rstd³/D)·(Σ dy⊙w⊙x)·x (+ residual[row] with RESID), the CPU
/// reference's formula; the dw contribution Σ_rows dy⊙x·rstd of each row slot (threadIdx.y) is
/// accumulated in registers, then the slots are summed in order into partial[blockIdx.x, :].
/// Grid: G blocks of tx × ty threads, grid-stride over groups of ty rows. dx may alias
/// residual: each element is read and then written by the same thread. PART kInput skips the
/// dw accumulation (partial unused), kWeight the dx half (w, residual, dx unused).
template <class T, int VEC, int ITEMS, bool RESID, BackwardPart PART = BackwardPart::kAll>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_kernel(const T* dy, const T* x, const T* __restrict__ w, const float* __restrict__ rstd,
                            const T* residual, T* dx, float* __restrict__ partial, int64_t n, int d) {
  constexpr bool kDx = PART != BackwardPart::kWeight, kDw = PART != BackwardPart::kInput;
  __shared__ float sh[kMaxRowsPerBlock * 32];
  float acc[ITEMS][VEC];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[k][i] = 0.0f;
  const int64_t groups = ceil_div(n, blockDim.y);
  for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {  // uniform over the block
    const int64_t row = gi * blockDim.y + threadIdx.y;
    const bool valid = row < n;
    const int64_t base = (valid ? row : 0) * int64_t(d);
    const float r = valid ? rstd[row] : 0.0f;
    float gw[ITEMS][VEC], xv[ITEMS][VEC];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int c = (threadIdx.x + k * blockDim.x) * VEC;
      if (valid && c < d) {
        float g[VEC], wv[VEC];
        load_vec<T, VEC>(dy + base + c, g);
        load_vec<T, VEC>(x + base + c, xv[k]);
        if constexpr (kDx) load_vec<T, VEC>(w + c, wv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          if constexpr (kDx) {
            gw[k][i] = g[i] * wv[i];
            dot += gw[k][i] * xv[k][i];
          }
          if constexpr (kDw) acc[k][i] += g[i] * xv[k][i] * r;
        }
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) gw[k][i] = xv[k][i] = 0.0f;
      }
    }
    if constexpr (!kDx) continue;  // uniform: no barrier is skipped by part of the block
    dot = row_sum(dot, sh);
    if (!valid) continue;  // row_sum above was reached by every thread
    const float kk = r * r * r * dot / float(d);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int c = (threadIdx.x + k * blockDim.x) * VEC;
      if (c < d) {
        float o[VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) o[i] = r * gw[k][i] - kk * xv[k][i];
        if constexpr (RESID) {
          float res[VEC];
          load_vec<T, VEC>(residual + base + c, res);
#pragma unroll
          for (int i = 0; i < VEC; ++i) o[i] = res[i] + o[i];
        }
        store_vec<T, VEC>(dx + base + c, o);
      }
    }
  }
  if constexpr (!kDw) return;
  float* p = partial + int64_t(blockIdx.x) * d;
  if (blockDim.y == 1) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int c = (threadIdx.x + k * blockDim.x) * VEC;
      if (c < d) store_vec<float, VEC>(p + c, acc[k]);
    }
    return;
  }
  // Several row slots: sum them in slot order through shared memory (ty · width ≤ kSlotFloats,
  // guaranteed by row_launch), then slot 0 writes the block's partial row.
  __shared__ float slots[kSlotFloats];
  const int width = blockDim.x * ITEMS * VEC;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int i = 0; i < VEC; ++i) slots[threadIdx.y * width + (threadIdx.x + k * blockDim.x) * VEC + i] = acc[k][i];
  __syncthreads();
  if (threadIdx.y != 0) return;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int c = (threadIdx.x + k * blockDim.x) * VEC;
    if (c < d) {
      float t[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) t[i] = 0.0f;
      for (int y = 0; y < int(blockDim.y); ++y)
#pragma unroll
        for (int i = 0; i < VEC; ++i) t[i] += slots[y * width + c + i];
      store_vec<float, VEC>(p + c, t);
    }
  }
}

/// The backward for long rows: G blocks of kStreamThreads, one row at a time, dw partials
/// accumulated in place in partial[blockIdx.x, :] (each element owned by one thread). PART as
/// in rmsnorm_backward_kernel.
template <class T, int VEC, bool RESID, BackwardPart PART = BackwardPart::kAll>
__global__ void __launch_bounds__(kStreamThreads)
    rmsnorm_backward_stream_kernel(const T* dy, const T* x, const T* __restrict__ w, const float* __restrict__ rstd,
                                   const T* residual, T* dx, float* __restrict__ partial, int64_t n, int d) {
  constexpr bool kDx = PART != BackwardPart::kWeight, kDw = PART != BackwardPart::kInput;
  __shared__ float sh[32];
  float* p = kDw ? partial + int64_t(blockIdx.x) * d : nullptr;
  if constexpr (kDw)
    for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
      float z[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) z[i] = 0.0f;
      store_vec<float, VEC>(p + c, z);
    }
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const int64_t base = row * d;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
      float g[VEC], xv[VEC], wv[VEC], pv[VEC];
      load_vec<T, VEC>(dy + base + c, g);
      load_vec<T, VEC>(x + base + c, xv);
      if constexpr (kDx) load_vec<T, VEC>(w + c, wv);
      if constexpr (kDw) load_vec<float, VEC>(p + c, pv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        if constexpr (kDx) dot += g[i] * wv[i] * xv[i];
        if constexpr (kDw) pv[i] += g[i] * xv[i] * r;
      }
      if constexpr (kDw) store_vec<float, VEC>(p + c, pv);
    }
    if constexpr (!kDx) continue;  // uniform over the block: block_sum's barriers are all skipped
    dot = block_sum(dot, sh);
    const float kk = r * r * r * dot / float(d);
    for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
      float g[VEC], xv[VEC], wv[VEC], o[VEC];
      load_vec<T, VEC>(dy + base + c, g);
      load_vec<T, VEC>(x + base + c, xv);
      load_vec<T, VEC>(w + c, wv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) o[i] = r * (g[i] * wv[i]) - kk * xv[i];
      if constexpr (RESID) {
        float res[VEC];
        load_vec<T, VEC>(residual + base + c, res);
#pragma unroll
        for (int i = 0; i < VEC; ++i) o[i] = res[i] + o[i];
      }
      store_vec<T, VEC>(dx + base + c, o);
    }
  }
}

/// dw[c] += Σ_r partial[r, c] over r = 0 … rows − 1, in a fixed order: thread (x, y) of a
/// 32 × 32 block sums r ≡ y (mod 32) ascending, then row 0 adds the 32 sums in order.
__global__ void __launch_bounds__(1024)
    rmsnorm_dw_finalize_kernel(const float* __restrict__ partial, int64_t rows, int d, float* __restrict__ dw) {
  __shared__ float sh[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < d)
#pragma unroll 4
    for (int64_t r = threadIdx.y; r < rows; r += 32) s += partial[r * d + c];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < 32; ++y) t += sh[y][threadIdx.x];
    dw[c] += t;
  }
}

/// Number of backward blocks: up to kMaxBlocksPerSm resident blocks of `kernel` per SM, and no
/// more than a quarter of the row groups (so a block's partial row is amortized over ≥ 4 row
/// groups); at least 1. Depends only on n, D, the GPU model and the build, so the dw summation
/// order, hence the result, is reproducible.
template <class K>
int64_t backward_blocks(K kernel, int threads, int64_t groups) {
  int dev = 0, sms = 0, per_sm = 0;
  MT_CUDA(cudaGetDevice(&dev));
  MT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MT_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  const int64_t wave = int64_t(sms) * std::clamp(per_sm, 1, kMaxBlocksPerSm);
  return std::max<int64_t>(1, std::min(wave, ceil_div(groups, 4)));
}

/// Launches `kernel` on g blocks of `block` threads; with dw, then the fixed-order dw reduction
/// of its [g, D] partials (a temporary from `alloc`, released to the cache while the kernels
/// run: any reuse is ordered after them on stream s). Without dw (a dx-only part) nothing else.
template <class K, class T>
void run_backward(K kernel, int64_t g, dim3 block, const T* dy, const T* x, const T* w, const float* rstd,
                  const T* residual, T* dx, float* dw, int64_t n, int d, Allocator* alloc, cudaStream_t s,
                  const char* name) {
  Tensor partial;
  if (dw) partial = Tensor::empty(alloc, {g, d}, DType::kF32, MemCategory::kTemporaries);
  kernel<<<unsigned(g), block, 0, s>>>(dy, x, w, rstd, residual, dx, dw ? partial.f32() : nullptr, n, d);
  MT_CUDA_LAUNCH(name);
  if (!dw) return;
  rmsnorm_dw_finalize_kernel<<<unsigned(ceil_div(d, 32)), dim3(32, 32), 0, s>>>(partial.f32(), g, d, dw);
  MT_CUDA_LAUNCH("rmsnorm_dw_finalize_kernel");
}

/// The backward, or one part of it (PART), for rows of d elements read VEC at a time. The grid
/// is always the one the fused kernel <RESID> would get (backward_blocks of that kernel), so a
/// kWeight part sums dw in the fused kernel's order. dw is null for kInput.
template <class T, int VEC, bool RESID, BackwardPart PART>
void launch_backward(const T* dy, const T* x, const T* w, const float* rstd, const T* residual, T* dx, float* dw,
                     int64_t n, int d, Allocator* alloc, cudaStream_t s) {
  constexpr const char* kName = PART == BackwardPart::kWeight ? "rmsnorm_backward_weight_kernel"
                                : RESID                        ? "rmsnorm_backward_residual_kernel"
                                                               : "rmsnorm_backward_kernel";
  const RowLaunch L = row_launch(ceil_div(d, VEC), VEC);
  auto rows = [&](auto items) {
    constexpr int ITEMS = decltype(items)::value;
    if constexpr (ITEMS * VEC <= kMaxRowFloats) {  // other combinations are never selected
      const dim3 block(L.tx, L.ty);
      const int64_t groups = ceil_div(n, L.ty);
      const int64_t g = backward_blocks(rmsnorm_backward_kernel<T, VEC, ITEMS, RESID>, L.tx * L.ty, groups);
      run_backward(rmsnorm_backward_kernel<T, VEC, ITEMS, RESID, PART>, g, block, dy, x, w, rstd, residual, dx, dw,
                   n, d, alloc, s, kName);
    }
  };
  switch (L.items) {
    case 1: rows(std::integral_constant<int, 1>{}); break;
    case 2: rows(std::integral_constant<int, 2>{}); break;
    case 4: rows(std::integral_constant<int, 4>{}); break;
    case 8: rows(std::integral_constant<int, 8>{}); break;
    default: {
      const int64_t g = backward_blocks(rmsnorm_backward_stream_kernel<T, VEC, RESID>, kStreamThreads, n);
      run_backward(rmsnorm_backward_stream_kernel<T, VEC, RESID, PART>, g, dim3(kStreamThreads), dy, x, w, rstd,
                   residual, dx, dw, n, d, alloc, s, kName);
    }
  }
}

/// The fused backward when dw is given, else its dx part alone (same dx bits).
template <class T, int VEC, bool RESID>
void launch_backward(const T* dy, const T* x, const T* w, const float* rstd, const T* residual, T* dx, float* dw,
                     int64_t n, int d, Allocator* alloc, cudaStream_t s) {
  if (dw)
    launch_backward<T, VEC, RESID, BackwardPart::kAll>(dy, x, w, rstd, residual, dx, dw, n, d, alloc, s);
  else
    launch_backward<T, VEC, RESID, BackwardPart::kInput>(dy, x, w, rstd, residual, dx, nullptr, n, d, alloc, s);
}

// ---- host-side checks ----

/// Validates an RMSNorm call and returns {N, D}. `rows` are the [N, D] tensors (x first) that
/// must share x's dtype and numel; w (when given) [D] shares x's dtype; rstd f32 [N]; dw (when
/// given) f32 [D]. @throws std::invalid_argument naming the kernel, argument and mismatch.
struct Dims {
  int64_t n;
  int d;
};
Dims check_norm(const char* k, std::initializer_list<std::pair<const char*, const Tensor*>> rows, const Tensor* w,
                const Tensor& rstd, const Tensor* dw) {
  const Tensor& x = *rows.begin()->second;
  for (const auto& [name, t] : rows) require_defined(*t, k, name);
  if (w) require_defined(*w, k, "w");
  require_defined(rstd, k, "rstd");
  require(x.ndim() >= 1, k, "x must have a last dimension");
  require_float(x, k, "x");
  const int64_t d = x.dim(-1);
  require(d > 0 && d <= INT_MAX / 2, k, "row length D = " + std::to_string(d) + " out of range");
  const int64_t n = x.numel() / d;
  require(n < INT_MAX, k, "more than 2^31 rows");
  for (const auto& [name, t] : rows) {
    require(t->dtype() == x.dtype(), k,
            std::string(name) + " must be " + dtype_name(x.dtype()) + " like x, got " + dtype_name(t->dtype()));
    require_numel(*t, n * d, k, name);
  }
  if (w) {
    require(w->dtype() == x.dtype(), k, std::string("w must be ") + dtype_name(x.dtype()) + " like x, got " +
                                            dtype_name(w->dtype()));
    require_numel(*w, d, k, "w");
  }
  require_dtype(rstd, DType::kF32, k, "rstd");
  require_numel(rstd, n, k, "rstd");
  if (dw) {
    require_defined(*dw, k, "dw");
    require_dtype(*dw, DType::kF32, k, "dw");
    require_numel(*dw, d, k, "dw");
  }
  return {n, int(d)};
}

/// Whether every tensor is 16-byte aligned and D a multiple of the vector width.
bool vectorizable(int d, DType dt, std::initializer_list<const Tensor*> ts) {
  if (d % (dt == DType::kBF16 ? kVec<bf16> : kVec<float>) != 0) return false;
  for (const Tensor* t : ts)
    if (!aligned16(t->raw())) return false;
  return true;
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

}  // namespace

/// y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps) per row (Zhang & Sennrich 2019). x, y
/// [..., D] (f32 or bf16), w [D] (x's dtype), rstd f32 [N] (N = numel / D). One pass over x.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  const auto [n, d] = check_norm("rmsnorm_forward", {{"x", &x}, {"y", &y}}, &w, rstd, nullptr);
  if (n == 0) return;
  const bool vec = vectorizable(d, x.dtype(), {&x, &y, &w});
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    if (vec)
      launch_forward<T, kVec<T>, false>(ptr<T>(x), nullptr, ptr<T>(w), ptr<T>(y), rstd.f32(), n, d, eps, compute_);
    else
      launch_forward<T, 1, false>(ptr<T>(x), nullptr, ptr<T>(w), ptr<T>(y), rstd.f32(), n, d, eps, compute_);
  });
}

/// h += delta (stored, rounded to h's dtype), then y = rmsnorm(h) · w as rmsnorm_forward, in one
/// pass over h. h, delta, y [..., D]; w [D]; rstd f32 [N]. @throws std::invalid_argument.
void CudaDevice::add_rmsnorm_forward(const Tensor& h, const Tensor& delta, const Tensor& w, float eps, const Tensor& y,
                                     const Tensor& rstd) {
  const auto [n, d] = check_norm("add_rmsnorm_forward", {{"h", &h}, {"delta", &delta}, {"y", &y}}, &w, rstd, nullptr);
  if (n == 0) return;
  const bool vec = vectorizable(d, h.dtype(), {&h, &delta, &y, &w});
  MT_DISPATCH_FLOAT(h.dtype(), T, {
    if (vec)
      launch_forward<T, kVec<T>, true>(ptr<T>(h), ptr<T>(delta), ptr<T>(w), ptr<T>(y), rstd.f32(), n, d, eps,
                                       compute_);
    else
      launch_forward<T, 1, true>(ptr<T>(h), ptr<T>(delta), ptr<T>(w), ptr<T>(y), rstd.f32(), n, d, eps, compute_);
  });
}

/// dx [..., D] overwritten with ∂(rmsnorm)/∂x · dy; dw f32 [D] accumulates Σ_rows dy ⊙ x · rstd
/// (deterministic two-stage sum, see the file comment), or is skipped when undefined (same dx
/// bits). dy, x, dx, w share one dtype; rstd f32 [N] from the forward. Temporary: [G, D] f32
/// partials (G ≤ 4 blocks per SM). @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                  const Tensor& dx, const Tensor& dw) {
  const Tensor* dwp = dw.defined() ? &dw : nullptr;
  const auto [n, d] = check_norm("rmsnorm_backward", {{"x", &x}, {"dy", &dy}, {"dx", &dx}}, &w, rstd, dwp);
  if (n == 0) return;
  const bool vec = vectorizable(d, x.dtype(), {&x, &dy, &dx, &w});
  float* dwf = dwp ? dw.f32() : nullptr;
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    if (vec)
      launch_backward<T, kVec<T>, false>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), rstd.f32(), nullptr, ptr<T>(dx), dwf, n,
                                         d, allocator(), compute_);
    else
      launch_backward<T, 1, false>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), rstd.f32(), nullptr, ptr<T>(dx), dwf, n, d,
                                   allocator(), compute_);
  });
}

/// rmsnorm_backward with dx = residual + ∂(rmsnorm)/∂x · dy; dx may alias residual; an
/// undefined dw is skipped. @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                           const Tensor& residual, const Tensor& dx, const Tensor& dw) {
  const Tensor* dwp = dw.defined() ? &dw : nullptr;
  const auto [n, d] = check_norm("rmsnorm_backward_residual",
                                 {{"x", &x}, {"dy", &dy}, {"residual", &residual}, {"dx", &dx}}, &w, rstd, dwp);
  if (n == 0) return;
  const bool vec = vectorizable(d, x.dtype(), {&x, &dy, &residual, &dx, &w});
  float* dwf = dwp ? dw.f32() : nullptr;
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    if (vec)
      launch_backward<T, kVec<T>, true>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), rstd.f32(), ptr<T>(residual), ptr<T>(dx),
                                        dwf, n, d, allocator(), compute_);
    else
      launch_backward<T, 1, true>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), rstd.f32(), ptr<T>(residual), ptr<T>(dx), dwf, n,
                                  d, allocator(), compute_);
  });
}

/// dw f32 [D] accumulates Σ_rows dy ⊙ x · rstd alone: the backward kernel's dw part on the
/// fused kernel's block shape and grid (the vector width chosen from dy's and x's alignment),
/// so it matches the fused dw bitwise whenever the fused call vectorized alike (its w, dx and
/// residual as aligned as dy and x, as freshly allocated activations and parameter views with
/// 16-byte offsets are). dy, x [..., D] share one dtype; rstd f32 [N].
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& dw) {
  const auto [n, d] = check_norm("rmsnorm_backward_weight", {{"x", &x}, {"dy", &dy}}, nullptr, rstd, &dw);
  if (n == 0) return;
  const bool vec = vectorizable(d, x.dtype(), {&x, &dy});
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    if (vec)
      launch_backward<T, kVec<T>, kWeightGrid, BackwardPart::kWeight>(
          ptr<T>(dy), ptr<T>(x), nullptr, rstd.f32(), nullptr, nullptr, dw.f32(), n, d, allocator(), compute_);
    else
      launch_backward<T, 1, kWeightGrid, BackwardPart::kWeight>(ptr<T>(dy), ptr<T>(x), nullptr, rstd.f32(), nullptr,
                                                                nullptr, dw.f32(), n, d, allocator(), compute_);
  });
}

}  // namespace meshtrain
