// Multi-tensor kernels (as PyTorch's multi_tensor_apply / apex's fused optimizers): one launch
// updates a batch of tensors, so an optimizer step over a model's ~150 tensors costs a handful
// of launches instead of ~150, and the gradient norm's square costs one host synchronization.
// A batch's pointers and sizes travel as a kernel argument (under the 4 KiB parameter limit);
// blockIdx.y picks the tensor, blockIdx.x grid-strides over it.
#include <algorithm>
#include <cmath>

#include "device/cuda/adamw_op.cuh"
#include "device/cuda/cuda_device.hpp"
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/reduce.cuh"

namespace meshtrain {

namespace {
using namespace cuda;

constexpr int kBatch = 24;  // tensors per launch: at most 24 × 52 bytes of kernel arguments
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocksX = 512;

struct AdamWBatch {
  float* w[kBatch];
  const float* g[kBatch];
  float* m[kBatch];
  float* v[kBatch];
  bf16* c[kBatch];  // compute copies (nullptr: none)
  int64_t n[kBatch];
  float decay[kBatch];
};

/// AdamW on tensor blockIdx.y of the batch (gradients read times grad_scale; the compute copy
/// written where set); when VEC = 4 the f32 pointers are 16-byte and the copies 8-byte aligned.
template <int VEC>
__global__ void __launch_bounds__(kThreads) adamw_multi_kernel(AdamWBatch b, float step_size, float inv_sqrt_bc2,
                                                               float b1, float b2, float eps, float grad_scale) {
  const int t = blockIdx.y;
  const AdamWOp op{b.w[t], b.g[t], b.m[t], b.v[t], b.decay[t], step_size, inv_sqrt_bc2,
                   b1, b2, eps, grad_scale, b.c[t]};
  const int64_t n = b.n[t], nv = n / VEC;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < nv; i += stride) op.template apply<VEC>(i * VEC);
  if constexpr (VEC > 1) {
    const int64_t tail = nv * VEC + tid;
    if (tail < n) op.template apply<1>(tail);
  }
}

struct SumSqBatch {
  const float* x[kBatch];
  int64_t n[kBatch];
  double inv_divisor[kBatch];
  int64_t slot[kBatch];     // first partial of this tensor in the scratch
  int32_t blocks[kBatch];   // partials (blocks) of this tensor: blocks_for(n)
};

/// partial[slot[t] + blockIdx.x] = Σ x_t² / divisor_t over the grid-stride slice of block
/// blockIdx.x among the tensor's own blocks[t] blocks (the grid follows the batch's largest
/// tensor; surplus blocks of a smaller one leave at once, so its partials stay in its slots and
/// its summation order depends on its size alone).
__global__ void __launch_bounds__(kThreads) sum_squares_multi_kernel(SumSqBatch b, double* partial) {
  __shared__ double sh[32];
  const int t = blockIdx.y;
  if (int(blockIdx.x) >= b.blocks[t]) return;  // uniform over the block: before any barrier
  const float* x = b.x[t];
  const int64_t n = b.n[t];
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(b.blocks[t]) * blockDim.x;
  double s = 0.0;
  for (int64_t i = tid; i < n; i += stride) s += double(x[i]) * double(x[i]);
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partial[b.slot[t] + blockIdx.x] = s * b.inv_divisor[t];
}

int64_t blocks_for(int64_t elems) { return std::clamp<int64_t>(ceil_div(elems, kThreads), 1, kMaxBlocksX); }

}  // namespace

/// One AdamW step on every segment: batches of up to kBatch tensors per launch, the segments
/// whose four f32 pointers are 16-byte aligned (and compute copy 8-byte aligned) through float4,
/// the others element by element; each segment's bf16 compute copy, when given, is written in the
/// same pass (the cast that would follow the step, without reading the param again). Bias
/// corrections as adamw() (and the CPU). @throws std::invalid_argument on dtype or numel.
void CudaDevice::adamw_multi(const std::vector<AdamWSegment>& segments, const AdamWParams& p) {
  constexpr const char* k = "adamw_multi";
  const float bc1 = 1.0f - std::pow(p.beta1, float(p.step));
  const float bc2 = 1.0f - std::pow(p.beta2, float(p.step));
  const float step_size = p.lr / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  for (int vec : {4, 1}) {
    AdamWBatch b{};
    int count = 0;
    int64_t max_n = 0;
    auto flush = [&] {
      if (count == 0) return;
      const dim3 grid(unsigned(blocks_for(ceil_div(max_n, vec))), unsigned(count));
      if (vec == 4)
        adamw_multi_kernel<4><<<grid, kThreads, 0, compute_>>>(b, step_size, inv_sqrt_bc2, p.beta1, p.beta2, p.eps,
                                                               p.grad_scale);
      else
        adamw_multi_kernel<1><<<grid, kThreads, 0, compute_>>>(b, step_size, inv_sqrt_bc2, p.beta1, p.beta2, p.eps,
                                                               p.grad_scale);
      MT_CUDA_LAUNCH("adamw_multi_kernel");
      count = 0;
      max_n = 0;
    };
    for (const AdamWSegment& s : segments) {
      for (const auto& [name, t] : {std::pair{"param", &s.param}, std::pair{"grad", &s.grad},
                                    std::pair{"exp_avg", &s.exp_avg}, std::pair{"exp_avg_sq", &s.exp_avg_sq}}) {
        require_defined(*t, k, name);
        require_dtype(*t, DType::kF32, k, name);
        require(t->numel() == s.param.numel(), k,
                std::string(name) + " numel " + std::to_string(t->numel()) + " vs param " +
                    std::to_string(s.param.numel()));
      }
      if (s.compute.defined()) {
        require_dtype(s.compute, DType::kBF16, k, "compute");
        require(s.compute.numel() == s.param.numel(), k,
                "compute numel " + std::to_string(s.compute.numel()) + " vs param " + std::to_string(s.param.numel()));
      }
      const int64_t n = s.param.numel();
      if (n == 0) continue;
      const bool aligned = aligned16(s.param.raw()) && aligned16(s.grad.raw()) && aligned16(s.exp_avg.raw()) &&
                           aligned16(s.exp_avg_sq.raw()) && (!s.compute.defined() || aligned_to(s.compute.raw(), 8));
      if (aligned != (vec == 4)) continue;  // the other pass takes it
      b.w[count] = s.param.f32();
      b.g[count] = s.grad.f32();
      b.m[count] = s.exp_avg.f32();
      b.v[count] = s.exp_avg_sq.f32();
      b.c[count] = s.compute.defined() ? static_cast<bf16*>(s.compute.raw()) : nullptr;
      b.n[count] = n;
      b.decay[count] = 1.0f - p.lr * s.weight_decay;
      max_n = std::max(max_n, n);
      if (++count == kBatch) flush();
    }
    flush();
  }
}

/// Σ_i Σ x_i² / divisor_i in fp64 over f32 tensors: per-(tensor, block) partials scaled by
/// 1/divisor, then one fixed-order sum and one host synchronization. Deterministic for given
/// sizes. bf16 inputs go through sum_squares() one by one. With `each`, the partials come back
/// to the host in the same synchronization (8 bytes per block) and are summed per tensor there.
/// @throws std::invalid_argument.
double CudaDevice::sum_squares_multi(const std::vector<Tensor>& xs, const std::vector<double>& divisors,
                                     std::vector<double>* each) {
  constexpr const char* k = "sum_squares_multi";
  require(xs.size() == divisors.size(), k,
          std::to_string(xs.size()) + " tensors but " + std::to_string(divisors.size()) + " divisors");
  if (each) each->assign(xs.size(), 0.0);
  double other = 0;  // bf16 tensors (not gradients in practice)
  int64_t slots = 0;
  std::vector<int64_t> first(xs.size(), -1);
  for (size_t i = 0; i < xs.size(); ++i) {
    require_defined(xs[i], k, "x");
    require_float(xs[i], k, "x");
    if (xs[i].numel() == 0) continue;
    if (xs[i].dtype() != DType::kF32) {
      const double term = sum_squares(xs[i]) / divisors[i];
      other += term;
      if (each) (*each)[i] = term;
      continue;
    }
    first[i] = slots;
    slots += blocks_for(xs[i].numel());
  }
  if (slots == 0) return other;
  double* scratch = reduce_scratch(slots + 1);
  SumSqBatch b{};
  int count = 0;
  int64_t max_n = 0;
  auto flush = [&] {
    if (count == 0) return;
    const dim3 grid(unsigned(blocks_for(max_n)), unsigned(count));
    sum_squares_multi_kernel<<<grid, kThreads, 0, compute_>>>(b, scratch);
    MT_CUDA_LAUNCH("sum_squares_multi_kernel");
    count = 0;
    max_n = 0;
  };
  for (size_t i = 0; i < xs.size(); ++i) {
    if (first[i] < 0) continue;
    b.x[count] = xs[i].f32();
    b.n[count] = xs[i].numel();
    b.inv_divisor[count] = 1.0 / divisors[i];
    b.slot[count] = first[i];
    b.blocks[count] = int32_t(blocks_for(xs[i].numel()));
    max_n = std::max(max_n, xs[i].numel());
    if (++count == kBatch) flush();
  }
  flush();
  launch_sum_doubles(scratch, slots, scratch + slots, compute_);
  if (each) {  // every partial and the total: [0, slots) then [slots]
    MT_CUDA(cudaMemcpyAsync(host_scratch_, scratch, size_t(slots + 1) * sizeof(double), cudaMemcpyDeviceToHost, compute_));
  } else {
    MT_CUDA(cudaMemcpyAsync(host_scratch_ + slots, scratch + slots, sizeof(double), cudaMemcpyDeviceToHost, compute_));
  }
  MT_CUDA(cudaStreamSynchronize(compute_));
  check_error_flag();
  if (each)
    for (size_t i = 0; i < xs.size(); ++i) {
      if (first[i] < 0) continue;
      double t = 0;
      for (int64_t b = 0; b < blocks_for(xs[i].numel()); ++b) t += host_scratch_[first[i] + b];
      (*each)[i] = t;
    }
  return host_scratch_[slots] + other;
}

}  // namespace meshtrain
