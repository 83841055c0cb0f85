// CUDA kernels: rotary position embedding (Su et al. 2021, Meta's interleaved pairs) in place,
// and the SwiGLU gate (Shazeer 2020) forward and backward. All element-wise, memory-bound:
// 16-byte vector accesses where alignment allows, f32 arithmetic, one rounding per bf16 store.
#include <algorithm>
#include <climits>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/vec_io.cuh"

namespace meshtrain {

namespace {
using namespace cuda;

/// Rotates pairs (2j, 2j+1) of every head of x [rows = B·T, row_len = H·Dh] by ±θ[t, j], t =
/// row mod T: (a, b) → (a·cos − b·sin, a·sin + b·cos) with sin negated for the inverse, as the
/// CPU reference. One block per (b, t) row (grid-stride), threads over VEC-element slices
/// (VEC divides Dh, so a slice never straddles two heads). ALIGNED = vector loads.
template <class T, int VEC, bool ALIGNED>
__global__ void __launch_bounds__(256)
    rope_kernel(T* x, const float* __restrict__ cos_t, const float* __restrict__ sin_t, int64_t rows, int64_t t_len,
                int row_len, int dh, float sign) {
  static_assert(VEC % 2 == 0, "rope works on whole pairs");
  const int half = dh / 2;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t t = row % t_len;
    const float* cr = cos_t + t * half;
    const float* sr = sin_t + t * half;
    T* xr = x + row * row_len;
    for (int c = threadIdx.x * VEC; c < row_len; c += blockDim.x * VEC) {
      float v[VEC];
      if constexpr (ALIGNED)
        load_vec<T, VEC>(xr + c, v);
      else
        load_elems<T, VEC>(xr + c, v);
      const int j0 = (c % dh) / 2;
#pragma unroll
      for (int p = 0; p < VEC / 2; ++p) {
        const float cs = cr[j0 + p], sn = sign * sr[j0 + p];
        const float a = v[2 * p], b = v[2 * p + 1];
        v[2 * p] = a * cs - b * sn;
        v[2 * p + 1] = a * sn + b * cs;
      }
      if constexpr (ALIGNED)
        store_vec<T, VEC>(xr + c, v);
      else
        store_elems<T, VEC>(xr + c, v);
    }
  }
}

template <class T, int VEC, bool ALIGNED>
void launch_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, float sign, cudaStream_t s) {
  const int64_t rows = x.dim(0) * x.dim(1), t_len = x.dim(1);
  const int dh = int(x.dim(3)), row_len = int(x.dim(2) * x.dim(3));
  const int threads = std::min(256, round_up_warp(ceil_div(row_len, VEC)));
  rope_kernel<T, VEC, ALIGNED><<<unsigned(std::min<int64_t>(rows, 1 << 20)), threads, 0, s>>>(
      static_cast<T*>(x.raw()), cos.f32(), sin.f32(), rows, t_len, row_len, dh, sign);
  MT_CUDA_LAUNCH("rope_kernel");
}

/// silu(a) = a·σ(a) with σ(a) = 1/(1 + e^−a), written as the CPU reference does.
__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

/// y = silu(a) ⊙ b.
template <class T>
struct SwigluForward {
  const T* a;
  const T* b;
  T* y;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float av[N], bv[N], o[N];
    load_vec<T, N>(a + i, av);
    load_vec<T, N>(b + i, bv);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = av[k] / (1.0f + expf(-av[k])) * bv[k];
    store_vec<T, N>(y + i, o);
  }
};

/// db = dy ⊙ silu(a); da = dy ⊙ b ⊙ σ(a)(1 + a(1 − σ(a))) (d silu/da). Inputs are read before
/// outputs are written, so da / db may alias dy, a or b element-wise.
template <class T>
struct SwigluBackward {
  const T* dy;
  const T* a;
  const T* b;
  T* da;
  T* db;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float g[N], av[N], bv[N], oa[N], ob[N];
    load_vec<T, N>(dy + i, g);
    load_vec<T, N>(a + i, av);
    load_vec<T, N>(b + i, bv);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float x = av[k], sig = sigmoid(x);
      ob[k] = g[k] * (x * sig);
      oa[k] = g[k] * bv[k] * sig * (1.0f + x * (1.0f - sig));
    }
    store_vec<T, N>(da + i, oa);
    store_vec<T, N>(db + i, ob);
  }
};

/// @throws std::invalid_argument unless every tensor is defined, shares the dtype (f32 or bf16)
/// and the numel of the first.
void check_elementwise(const char* k, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const Tensor& first = *ts.begin()->second;
  for (const auto& [name, t] : ts) require_defined(*t, k, name);
  require_float(first, k, ts.begin()->first);
  for (const auto& [name, t] : ts) {
    require(t->dtype() == first.dtype(), k,
            std::string(name) + " must be " + dtype_name(first.dtype()) + ", got " + dtype_name(t->dtype()));
    require_numel(*t, first.numel(), k, name);
  }
}

bool all_aligned16(std::initializer_list<const Tensor*> ts) {
  return std::all_of(ts.begin(), ts.end(), [](const Tensor* t) { return aligned16(t->raw()); });
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

}  // namespace

/// Rotary embedding in place on x [B, T, H, Dh] (f32 or bf16, Dh even) with tables cos, sin
/// f32 [≥ T, Dh/2]; inverse rotates by −θ (the backward). @throws std::invalid_argument on
/// shapes or dtypes.
void CudaDevice::rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  constexpr const char* k = "rope";
  require_defined(x, k, "x");
  require_defined(cos, k, "cos");
  require_defined(sin, k, "sin");
  require(x.ndim() == 4, k, "x must be [B, T, H, Dh], got " + shape_str(x.shape()));
  require_float(x, k, "x");
  require_dtype(cos, DType::kF32, k, "cos");
  require_dtype(sin, DType::kF32, k, "sin");
  const int64_t t = x.dim(1), dh = x.dim(3);
  require(dh % 2 == 0, k, "head dim " + std::to_string(dh) + " must be even");
  require(x.dim(2) * dh <= INT_MAX / 2, k, "H·Dh too large");
  for (const Tensor* tab : {&cos, &sin})
    require(tab->ndim() == 2 && tab->dim(0) >= t && tab->dim(1) == dh / 2, k,
            "table " + shape_str(tab->shape()) + " must be [>= " + std::to_string(t) + ", " + std::to_string(dh / 2) +
                "] for x " + shape_str(x.shape()));
  if (x.numel() == 0) return;
  const float sign = inverse ? -1.0f : 1.0f;
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    if (dh % kVec<T> == 0 && aligned16(x.raw()))
      launch_rope<T, kVec<T>, true>(x, cos, sin, sign, compute_);
    else
      launch_rope<T, 2, false>(x, cos, sin, sign, compute_);
  });
}

/// y = silu(a) ⊙ b (Shazeer 2020); a, b, y [N, H] of one dtype (f32 or bf16).
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& y) {
  check_elementwise("swiglu_forward", {{"a", &a}, {"b", &b}, {"y", &y}});
  const bool vec = all_aligned16({&a, &b, &y});
  MT_DISPATCH_FLOAT(a.dtype(), T, {
    const SwigluForward<T> op{ptr<T>(a), ptr<T>(b), ptr<T>(y)};
    if (vec)
      launch_flat<kVec<T>>(a.numel(), op, compute_, "swiglu_forward");
    else
      launch_flat<1>(a.numel(), op, compute_, "swiglu_forward");
  });
}

/// da, db [N, H] overwritten with the gradients of swiglu_forward given dy; one dtype.
/// @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::swiglu_backward(const Tensor& dy, const Tensor& a, const Tensor& b, const Tensor& da,
                                 const Tensor& db) {
  check_elementwise("swiglu_backward", {{"dy", &dy}, {"a", &a}, {"b", &b}, {"da", &da}, {"db", &db}});
  const bool vec = all_aligned16({&dy, &a, &b, &da, &db});
  MT_DISPATCH_FLOAT(a.dtype(), T, {
    const SwigluBackward<T> op{ptr<T>(dy), ptr<T>(a), ptr<T>(b), ptr<T>(da), ptr<T>(db)};
    if (vec)
      launch_flat<kVec<T>>(a.numel(), op, compute_, "swiglu_backward");
    else
      launch_flat<1>(a.numel(), op, compute_, "swiglu_backward");
  });
}

}  // namespace meshtrain
