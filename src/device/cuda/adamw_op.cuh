#pragma once
/// @file The per-element AdamW update shared by CudaDevice::adamw (one tensor) and
/// CudaDevice::adamw_multi (a batch of tensors in one launch).
#include "device/cuda/vec_io.cuh"

namespace meshtrain::cuda {

/// One AdamW step (Loshchilov & Hutter 2019, Algorithm 2, torch.optim.AdamW) per element, in
/// the CPU reference's arithmetic order: g = gs·grad; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g·g;
/// w = w·decay − step_size·m / (sqrt(v)·inv_sqrt_bc2 + eps); then, when c is set, c = bf16(w)
/// rounded to nearest even (the mixed-precision compute copy, as the cast kernel writes it).
/// Alignment for N > 1: w, g, m, v 16 bytes, c 2·N bytes (vec_io.cuh).
struct AdamWOp {
  float* w;
  const float* g;
  float* m;
  float* v;
  float decay, step_size, inv_sqrt_bc2, b1, b2, eps;
  float gs = 1.0f;     // gradient scale: global-norm clipping's coefficient
  bf16* c = nullptr;   // compute copy, or none
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float wv[N], gv[N], mv[N], vv[N];
    load_vec<float, N>(w + i, wv);
    load_vec<float, N>(g + i, gv);
    load_vec<float, N>(m + i, mv);
    load_vec<float, N>(v + i, vv);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float gi = gv[k] * gs;
      mv[k] = b1 * mv[k] + (1.0f - b1) * gi;
      vv[k] = b2 * vv[k] + (1.0f - b2) * gi * gi;
      wv[k] = wv[k] * decay - step_size * mv[k] / (sqrtf(vv[k]) * inv_sqrt_bc2 + eps);
    }
    store_vec<float, N>(m + i, mv);
    store_vec<float, N>(v + i, vv);
    store_vec<float, N>(w + i, wv);
    if (c) store_vec<bf16, N>(c + i, wv);
  }
};

}  // namespace meshtrain::cuda
