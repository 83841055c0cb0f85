#pragma once
/// @file Device-side helpers shared by the CUDA kernels: bf16 / f32 loads and stores through
/// one template, warp and block reductions, and the dtype dispatch of host launchers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "device/cuda/cuda_check.hpp"
#include "tensor/tensor.hpp"

namespace meshtrain::cuda {

using bf16 = __nv_bfloat16;

template <class T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f<bf16>(bf16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
/// `shared` holds ≥ 32 values of T. Fixed order, so deterministic.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[wid] = v;
  __syncthreads();
  T r = lane < nw ? shared[lane] : T(0);
  return warp_sum(r);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[wid] = v;
  __syncthreads();
  float r = lane < nw ? shared[lane] : -INFINITY;
  return warp_max(r);
}

/// Records the first offending id (id + 1, so 0 means none) for CudaDevice::check_error_flag.
/// id −1 would encode as 0 ("none") and be lost, so it is recorded as INT_MIN instead: the
/// error still surfaces, with a wrong id in the message (INT_MIN − 1 read back as int64).
__device__ __forceinline__ void flag_bad_id(int* flag, int id) {
  const int code = id + 1;  // id ≤ INT_MAX − 1 here: the vocabulary bound is < INT_MAX
  atomicCAS(flag, 0, code != 0 ? code : INT_MIN);
}

/// Blocks of `threads` covering n elements, capped for grid-stride loops.
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > cap ? cap : b));
}

/// Elements of T in one 16-byte vector (f32: 4, bf16: 8): the unit of coalesced loads.
template <class T>
inline constexpr int kVec = int(16 / sizeof(T));

/// Whether p is aligned to `bytes` (a power of two); 16 is the condition for vector access.
inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void* p) { return aligned_to(p, 16); }

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
/// n rounded up to a whole number of warps, at least one warp.
inline int round_up_warp(int64_t n) { return n <= 32 ? 32 : int((n + 31) / 32 * 32); }

/// @throws std::invalid_argument("<kernel>: <what>") unless ok.
inline void require(bool ok, const char* kernel, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(kernel) + ": " + what);
}
/// @throws std::invalid_argument unless t has `n` elements (message names shapes).
inline void require_numel(const Tensor& t, int64_t n, const char* kernel, const char* arg) {
  if (t.numel() != n)
    throw std::invalid_argument(std::string(kernel) + ": " + arg + " has " + std::to_string(t.numel()) +
                                " elements (shape " + shape_str(t.shape()) + "), expected " + std::to_string(n));
}
/// @throws std::invalid_argument unless t is defined (a kernel argument that must exist).
inline void require_defined(const Tensor& t, const char* kernel, const char* arg) {
  if (!t.defined()) throw std::invalid_argument(std::string(kernel) + ": " + arg + " is undefined");
}

/// @throws std::invalid_argument unless t is f32 or bf16 (names the kernel and argument).
inline void require_float(const Tensor& t, const char* kernel, const char* arg) {
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16)
    throw std::invalid_argument(std::string(kernel) + ": " + arg + " must be float32 or bfloat16, got " +
                                dtype_name(t.dtype()));
}
/// @throws std::invalid_argument unless t has dtype d.
inline void require_dtype(const Tensor& t, DType d, const char* kernel, const char* arg) {
  if (t.dtype() != d)
    throw std::invalid_argument(std::string(kernel) + ": " + arg + " must be " + dtype_name(d) + ", got " +
                                dtype_name(t.dtype()));
}
/// @throws std::invalid_argument unless a and b have the same dtype.
inline void require_same(const Tensor& a, const Tensor& b, const char* kernel) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(kernel) + ": mixed dtypes " + dtype_name(a.dtype()) + " and " +
                                dtype_name(b.dtype()));
}

}  // namespace meshtrain::cuda

/// Runs the statement with `T` bound to float or bf16 according to the DType `dt`.
#define MT_DISPATCH_FLOAT(dt, T, ...)                           \
  do {                                                          \
    if ((dt) == ::meshtrain::DType::kBF16) {                    \
      using T = ::meshtrain::cuda::bf16;                        \
      __VA_ARGS__;                                              \
    } else {                                                    \
      using T = float;                                          \
      __VA_ARGS__;                                              \
    }                                                           \
  } while (0)
