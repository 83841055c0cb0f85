// CUDA: fixed-order fp64 sum of per-row / per-block partials (see reduce.cuh).
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/reduce.cuh"

namespace meshtrain::cuda {

namespace {
constexpr int kSumThreads = 1024;

__global__ void __launch_bounds__(kSumThreads) sum_doubles_kernel(const double* in, int64_t n, double* out) {
  __shared__ double sh[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = s;
}
}  // namespace

void launch_sum_doubles(const double* in, int64_t n, double* out, cudaStream_t stream) {
  sum_doubles_kernel<<<1, kSumThreads, 0, stream>>>(in, n, out);
  MT_CUDA_LAUNCH("sum_doubles_kernel");
}

}  // namespace meshtrain::cuda
