#pragma once
/// @file Vector memory access for the CUDA kernels: N consecutive f32 or bf16 elements loaded
/// into (stored from) f32 registers with 16-byte transactions, and the grid-stride launcher of
/// element-wise kernels (vectorized body, scalar tail).
///
/// Alignment contract of load_vec / store_vec: p is aligned to min(16, N·sizeof(T)) bytes. Host
/// launchers guarantee it by choosing N = kVec<T> only when every pointer is 16-byte aligned and
/// every row length is a multiple of kVec<T>, and N = 1 otherwise.
#include <cstdint>
#include <type_traits>

#include "device/cuda/kernel_common.cuh"

namespace meshtrain::cuda {

/// Two bf16 (low half = lower address, little-endian) widened exactly to f32.
__device__ __forceinline__ void unpack_bf16x2(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
/// Two f32 rounded to nearest even bf16 and packed (lo at the lower address).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

/// f[0, N) = p[0, N) widened to f32. N = 1, 2, 4 (f32 / bf16) or a multiple of 16 bytes' worth.
template <class T, int N>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[N]) {
  if constexpr (N == 1) {
    f[0] = to_f<T>(*p);
  } else if constexpr (std::is_same_v<T, float>) {
    if constexpr (N == 2) {
      const float2 v = *reinterpret_cast<const float2*>(p);
      f[0] = v.x, f[1] = v.y;
    } else {
      static_assert(N % 4 == 0, "f32 vectors are 2 or a multiple of 4 elements");
#pragma unroll
      for (int k = 0; k < N / 4; ++k) {
        const float4 v = reinterpret_cast<const float4*>(p)[k];
        f[4 * k] = v.x, f[4 * k + 1] = v.y, f[4 * k + 2] = v.z, f[4 * k + 3] = v.w;
      }
    }
  } else {
    static_assert(std::is_same_v<T, bf16>, "load_vec: float or bf16");
    if constexpr (N == 2) {
      unpack_bf16x2(*reinterpret_cast<const uint32_t*>(p), f[0], f[1]);
    } else if constexpr (N == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      unpack_bf16x2(v.x, f[0], f[1]);
      unpack_bf16x2(v.y, f[2], f[3]);
    } else {
      static_assert(N % 8 == 0, "bf16 vectors are 2, 4 or a multiple of 8 elements");
#pragma unroll
      for (int k = 0; k < N / 8; ++k) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[k];
        unpack_bf16x2(v.x, f[8 * k], f[8 * k + 1]);
        unpack_bf16x2(v.y, f[8 * k + 2], f[8 * k + 3]);
        unpack_bf16x2(v.z, f[8 * k + 4], f[8 * k + 5]);
        unpack_bf16x2(v.w, f[8 * k + 6], f[8 * k + 7]);
      }
    }
  }
}

/// p[0, N) = f[0, N) (rounded to nearest even for bf16); same shapes as load_vec.
template <class T, int N>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[N]) {
  if constexpr (N == 1) {
    *p = from_f<T>(f[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    if constexpr (N == 2) {
      *reinterpret_cast<float2*>(p) = make_float2(f[0], f[1]);
    } else {
      static_assert(N % 4 == 0, "f32 vectors are 2 or a multiple of 4 elements");
#pragma unroll
      for (int k = 0; k < N / 4; ++k)
        reinterpret_cast<float4*>(p)[k] = make_float4(f[4 * k], f[4 * k + 1], f[4 * k + 2], f[4 * k + 3]);
    }
  } else {
    static_assert(std::is_same_v<T, bf16>, "store_vec: float or bf16");
    if constexpr (N == 2) {
      *reinterpret_cast<uint32_t*>(p) = pack_bf16x2(f[0], f[1]);
    } else if constexpr (N == 4) {
      *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]));
    } else {
      static_assert(N % 8 == 0, "bf16 vectors are 2, 4 or a multiple of 8 elements");
#pragma unroll
      for (int k = 0; k < N / 8; ++k)
        reinterpret_cast<uint4*>(p)[k] =
            make_uint4(pack_bf16x2(f[8 * k], f[8 * k + 1]), pack_bf16x2(f[8 * k + 2], f[8 * k + 3]),
                       pack_bf16x2(f[8 * k + 4], f[8 * k + 5]), pack_bf16x2(f[8 * k + 6], f[8 * k + 7]));
    }
  }
}

/// Element-by-element versions of load_vec / store_vec: no alignment beyond T's own.
template <class T, int N>
__device__ __forceinline__ void load_elems(const T* p, float (&f)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) f[i] = to_f<T>(p[i]);
}
template <class T, int N>
__device__ __forceinline__ void store_elems(T* p, const float (&f)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) p[i] = from_f<T>(f[i]);
}

/// Grid-stride element-wise kernel over n elements: op.template apply<VEC>(i) handles
/// [i, i + VEC) for every i multiple of VEC below n − n % VEC, then apply<1> the scalar tail
/// (fewer than VEC elements, one per thread of the first threads of the grid).
template <int VEC, class Op>
__global__ void __launch_bounds__(256) flat_kernel(int64_t n, Op op) {
  const int64_t nv = n / VEC;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < nv; i += stride) op.template apply<VEC>(i * VEC);
  if constexpr (VEC > 1) {
    const int64_t t = nv * VEC + tid;
    if (t < n) op.template apply<1>(t);
  }
}

/// Launches flat_kernel<VEC> on `stream` (nothing for n = 0). The caller picks VEC > 1 only
/// when every pointer op touches is 16-byte aligned. @throws std::runtime_error on a launch error.
template <int VEC, class Op>
void launch_flat(int64_t n, const Op& op, cudaStream_t stream, const char* name) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  flat_kernel<VEC, Op><<<grid_for(ceil_div(n, VEC), kThreads), kThreads, 0, stream>>>(n, op);
  MT_CUDA_LAUNCH(name);
}

}  // namespace meshtrain::cuda
