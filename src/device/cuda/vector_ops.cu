// CUDA kernels on flat tensors: the fused AdamW step, the fp64 sum of squares (gradient norm),
// scale / add / fill / cast, and the copies (cudaMemcpy*Async on the compute stream).
// Element-wise kernels are grid-stride with 16-byte accesses when every pointer is aligned
// (launch_flat, vec_io.cuh) and a scalar tail.
#include <algorithm>
#include <cmath>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/reduce.cuh"
#include "device/cuda/adamw_op.cuh"
#include "device/cuda/vec_io.cuh"

namespace meshtrain {

namespace {
using namespace cuda;


template <class T>
struct ScaleOp {
  T* x;
  float alpha;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float v[N];
    load_vec<T, N>(x + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] *= alpha;
    store_vec<T, N>(x + i, v);
  }
};

/// x *= float(*scale): the factor read on the device (scale_to_unit_norm).
template <class T>
struct ScaleByDeviceOp {
  T* x;
  const double* scale;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    const float alpha = float(*scale);
    float v[N];
    load_vec<T, N>(x + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] *= alpha;
    store_vec<T, N>(x + i, v);
  }
};

/// s[0] = 1 / (sqrt(s[0]) + eps): a sum of squares into the unit-norm factor, in fp64 as the
/// host would compute it (sqrt and division correctly rounded on both).
__global__ void unit_norm_factor_kernel(double* s, double eps) { s[0] = 1.0 / (sqrt(s[0]) + eps); }

/// y += alpha · x (f32 arithmetic, one rounding for bf16 y).
template <class T>
struct AddOp {
  T* y;
  const T* x;
  float alpha;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float yv[N], xv[N];
    load_vec<T, N>(y + i, yv);
    load_vec<T, N>(x + i, xv);
#pragma unroll
    for (int k = 0; k < N; ++k) yv[k] += alpha * xv[k];
    store_vec<T, N>(y + i, yv);
  }
};

template <class T>
struct FillOp {
  T* x;
  float value;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = value;
    store_vec<T, N>(x + i, v);
  }
};

/// dst = src converted through f32: bf16 → f32 exact, f32 → bf16 round-to-nearest-even
/// (__float2bfloat16_rn, as torch's .to(torch.bfloat16)).
template <class S, class D>
struct CastOp {
  D* dst;
  const S* src;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float v[N];
    load_vec<S, N>(src + i, v);
    store_vec<D, N>(dst + i, v);
  }
};

/// Stage 1 of sum_squares: partial[b] = Σ x² (fp64) over the grid-stride slice of block b.
/// The order of every sum is fixed by n and the grid size, which depend only on n.
template <class T, int VEC>
__global__ void __launch_bounds__(256) sum_squares_kernel(const T* __restrict__ x, int64_t n, double* partial) {
  __shared__ double sh[32];
  const int64_t nv = n / VEC;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  double s = 0.0;
  for (int64_t i = tid; i < nv; i += stride) {
    float v[VEC];
    load_vec<T, VEC>(x + i * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += double(v[k]) * double(v[k]);
  }
  if (VEC > 1 && nv * VEC + tid < n) {  // the scalar tail (fewer than VEC elements)
    const double t = to_f<T>(x[nv * VEC + tid]);
    s += t * t;
  }
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

constexpr int kSumSqThreads = 256;
constexpr int64_t kSumSqMaxBlocks = 1024;

/// @throws std::invalid_argument unless a and b have equal numel.
void require_same_numel(const Tensor& a, const Tensor& b, const char* k) {
  require(a.numel() == b.numel(), k,
          "numel " + std::to_string(a.numel()) + " " + shape_str(a.shape()) + " vs " + std::to_string(b.numel()) +
              " " + shape_str(b.shape()));
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

}  // namespace

/// One AdamW step in place on flat f32 tensors of equal numel: param (master weights), grad,
/// exp_avg, exp_avg_sq (AdamWParams: Loshchilov & Hutter 2019 / torch.optim.AdamW). The bias
/// corrections are computed on the host exactly as the CPU backend does; every gradient element
/// is read times p.grad_scale. One fused pass, float4 when all four are 16-byte aligned. @throws std::invalid_argument on dtypes or numel.
void CudaDevice::adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                       const AdamWParams& p) {
  constexpr const char* k = "adamw";
  for (const auto& [name, t] :
       {std::pair{"param", &param}, std::pair{"grad", &grad}, std::pair{"exp_avg", &exp_avg},
        std::pair{"exp_avg_sq", &exp_avg_sq}}) {
    require_defined(*t, k, name);
    require_dtype(*t, DType::kF32, k, name);
    require_same_numel(param, *t, k);
  }
  const float bc1 = 1.0f - std::pow(p.beta1, float(p.step));
  const float bc2 = 1.0f - std::pow(p.beta2, float(p.step));
  const AdamWOp op{param.f32(), grad.f32(), exp_avg.f32(), exp_avg_sq.f32(), 1.0f - p.lr * p.weight_decay,
                   p.lr / bc1, 1.0f / std::sqrt(bc2), p.beta1, p.beta2, p.eps, p.grad_scale};
  if (aligned16(op.w) && aligned16(op.g) && aligned16(op.m) && aligned16(op.v))
    launch_flat<4>(param.numel(), op, compute_, "adamw");
  else
    launch_flat<1>(param.numel(), op, compute_, "adamw");
}

/// Σ x² in fp64 of x (f32, or bf16) for the gradient norm: per-block fp64 partials, then one
/// fixed-order block sum (deterministic for a given numel). Synchronizes the compute stream.
/// @throws std::out_of_range when a kernel flagged a bad id; std::invalid_argument on dtype.
double CudaDevice::sum_squares(const Tensor& x) {
  constexpr const char* k = "sum_squares";
  require_defined(x, k, "x");
  require_float(x, k, "x");
  if (x.numel() == 0) return 0.0;
  const double* total = queue_sum_squares(x);
  MT_CUDA(cudaMemcpyAsync(host_scratch_, total, sizeof(double), cudaMemcpyDeviceToHost, compute_));
  MT_CUDA(cudaStreamSynchronize(compute_));
  check_error_flag();
  return host_scratch_[0];
}

double* CudaDevice::queue_sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  const bool vec = aligned16(x.raw());
  double* total = nullptr;
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    constexpr int V = kVec<T>;
    const int64_t blocks = std::min(kSumSqMaxBlocks, ceil_div(vec ? ceil_div(n, V) : n, kSumSqThreads));
    double* scratch = reduce_scratch(blocks + 1);
    if (vec)
      sum_squares_kernel<T, V><<<unsigned(blocks), kSumSqThreads, 0, compute_>>>(ptr<T>(x), n, scratch);
    else
      sum_squares_kernel<T, 1><<<unsigned(blocks), kSumSqThreads, 0, compute_>>>(ptr<T>(x), n, scratch);
    MT_CUDA_LAUNCH("sum_squares_kernel");
    launch_sum_doubles(scratch, blocks, scratch + blocks, compute_);
    total = scratch + blocks;
  });
  return total;
}

/// x ← x · float(1 / (sqrt(Σ x²) + eps)) with the sum, the factor and the scaling all on the
/// compute stream (queue_sum_squares, then one thread for the factor): the same bits as
/// sum_squares + scale, without the host synchronization between them.
/// @throws std::invalid_argument on dtype.
void CudaDevice::scale_to_unit_norm(const Tensor& x, double eps) {
  constexpr const char* k = "scale_to_unit_norm";
  require_defined(x, k, "x");
  require_float(x, k, "x");
  const int64_t n = x.numel();
  if (n == 0) return;
  double* factor = queue_sum_squares(x);
  unit_norm_factor_kernel<<<1, 1, 0, compute_>>>(factor, eps);
  MT_CUDA_LAUNCH("unit_norm_factor_kernel");
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    const ScaleByDeviceOp<T> op{ptr<T>(x), factor};
    if (aligned16(op.x))
      launch_flat<kVec<T>>(n, op, compute_, "scale_to_unit_norm");
    else
      launch_flat<1>(n, op, compute_, "scale_to_unit_norm");
  });
}

/// x *= alpha in place (f32 or bf16). @throws std::invalid_argument on dtype.
void CudaDevice::scale(const Tensor& x, float alpha) {
  require_defined(x, "scale", "x");
  require_float(x, "scale", "x");
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    const ScaleOp<T> op{ptr<T>(x), alpha};
    if (aligned16(op.x))
      launch_flat<kVec<T>>(x.numel(), op, compute_, "scale");
    else
      launch_flat<1>(x.numel(), op, compute_, "scale");
  });
}

/// y += alpha · x, equal numel and dtype (f32 or bf16). @throws std::invalid_argument.
void CudaDevice::add(const Tensor& y, const Tensor& x, float alpha) {
  constexpr const char* k = "add";
  require_defined(y, k, "y");
  require_defined(x, k, "x");
  require_float(y, k, "y");
  require_same(y, x, k);
  require_same_numel(y, x, k);
  MT_DISPATCH_FLOAT(y.dtype(), T, {
    const AddOp<T> op{ptr<T>(y), ptr<T>(x), alpha};
    if (aligned16(op.y) && aligned16(op.x))
      launch_flat<kVec<T>>(y.numel(), op, compute_, "add");
    else
      launch_flat<1>(y.numel(), op, compute_, "add");
  });
}

/// dst = src (equal numel and dtype, any dtype): an asynchronous device-to-device copy on the
/// compute stream. @throws std::invalid_argument.
void CudaDevice::copy(const Tensor& dst, const Tensor& src) {
  constexpr const char* k = "copy";
  require_defined(dst, k, "dst");
  require_defined(src, k, "src");
  require_same(dst, src, k);
  require_same_numel(dst, src, k);
  if (src.numel() == 0 || dst.raw() == src.raw()) return;
  MT_CUDA(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, compute_));
}

/// dst[n, dst_col + j] = src[n, src_col + j] for j < cols; dst [N, Cd], src [N, Cs] of one dtype
/// (any). One strided cudaMemcpy2DAsync on the compute stream. @throws std::invalid_argument
/// when the block lies outside either matrix or shapes / dtypes differ.
void CudaDevice::copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols) {
  constexpr const char* k = "copy_columns";
  require_defined(dst, k, "dst");
  require_defined(src, k, "src");
  require(dst.ndim() == 2 && src.ndim() == 2, k,
          "dst " + shape_str(dst.shape()) + " and src " + shape_str(src.shape()) + " must be 2-D");
  require_same(dst, src, k);
  const int64_t n = dst.dim(0), cd = dst.dim(1), cs = src.dim(1);
  require(src.dim(0) == n && dst_col >= 0 && src_col >= 0 && cols >= 0 && dst_col + cols <= cd &&
              src_col + cols <= cs,
          k,
          "block of " + std::to_string(cols) + " columns at dst " + std::to_string(dst_col) + " / src " +
              std::to_string(src_col) + " outside dst " + shape_str(dst.shape()) + " or src " +
              shape_str(src.shape()));
  if (n == 0 || cols == 0) return;
  const size_t es = dtype_size(dst.dtype());
  MT_CUDA(cudaMemcpy2DAsync(static_cast<char*>(dst.raw()) + dst_col * es, cd * es,
                            static_cast<const char*>(src.raw()) + src_col * es, cs * es, cols * es, n,
                            cudaMemcpyDeviceToDevice, compute_));
}

/// x = value: f32 and bf16 (rounded) for any value; zero bytes (cudaMemsetAsync) for +0 and for
/// i32. @throws std::invalid_argument for a non-zero value into an i32 tensor.
void CudaDevice::fill(const Tensor& x, float value) {
  require_defined(x, "fill", "x");
  if (x.numel() == 0) return;
  if (value == 0.0f && !std::signbit(value)) {  // +0 is all-zero bytes in f32, bf16 and i32
    MT_CUDA(cudaMemsetAsync(x.raw(), 0, x.nbytes(), compute_));
    return;
  }
  require(x.dtype() != DType::kI32, "fill", "a non-zero value into an int32 tensor");
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    const FillOp<T> op{ptr<T>(x), value};
    if (aligned16(op.x))
      launch_flat<kVec<T>>(x.numel(), op, compute_, "fill");
    else
      launch_flat<1>(x.numel(), op, compute_, "fill");
  });
}

/// dst = src converted f32 ↔ bf16 (equal numel; bf16 rounds to nearest even); equal dtypes
/// copy. @throws std::invalid_argument for i32 or unequal numel.
void CudaDevice::cast(const Tensor& dst, const Tensor& src) {
  constexpr const char* k = "cast";
  require_defined(dst, k, "dst");
  require_defined(src, k, "src");
  require_same_numel(dst, src, k);
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  require_float(dst, k, "dst");
  require_float(src, k, "src");
  const bool vec = aligned16(dst.raw()) && aligned16(src.raw());
  if (src.dtype() == DType::kF32) {
    const CastOp<float, bf16> op{ptr<bf16>(dst), ptr<float>(src)};
    vec ? launch_flat<8>(src.numel(), op, compute_, "cast") : launch_flat<1>(src.numel(), op, compute_, "cast");
  } else {
    const CastOp<bf16, float> op{ptr<float>(dst), ptr<bf16>(src)};
    vec ? launch_flat<8>(src.numel(), op, compute_, "cast") : launch_flat<1>(src.numel(), op, compute_, "cast");
  }
}

}  // namespace meshtrain
