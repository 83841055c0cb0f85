// CUDA kernels: token embedding lookup (a vocab-parallel shard of the table) and its gradient.
//
// The backward is deterministic: token positions are sorted by row with CUB's stable radix sort,
// then the sorted positions are cut into chunks of S (fixed by N alone) and each run of equal
// rows into its pieces inside those chunks. One block per piece sums its gradients in token
// order; a run inside one chunk adds its sum to grad_weight at once, a run across chunks leaves
// one partial sum per chunk, which a second kernel adds up in chunk order. So a frequent token
// (a run of thousands of positions) is summed by many blocks in parallel instead of serially by
// one — the long tail of the former one-block-per-run kernel — and the order of every sum is
// still fixed by the shapes: no float atomics, a run is bitwise reproducible
// (doc/architecture.md, Determinism), at the cost of a sort of N int32 keys (tens of
// microseconds at N = 8192).
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/kernel_common.cuh"
#include "device/cuda/vec_io.cuh"

namespace meshtrain {

namespace {
using namespace cuda;

constexpr int64_t kMaxGrid = 1 << 20;  // grid-stride beyond this many rows

/// out row i = weight row tokens[i] − vocab_start, or zeros when the shard does not hold it;
/// rows are moved as raw units U (16, 8, 4 or 2 bytes) since no dtype conversion happens.
/// One block per token row (grid-stride), threads over the row's units.
template <class U>
__global__ void __launch_bounds__(256)
    embedding_forward_kernel(const U* __restrict__ weight, const int32_t* __restrict__ tokens, U* __restrict__ out,
                             int64_t n, int64_t row_units, int64_t vocab_start, int64_t v_local, int64_t vocab_size,
                             int* flag) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int id = tokens[i];
    if (threadIdx.x == 0 && (id < 0 || id >= vocab_size)) flag_bad_id(flag, id);
    const int64_t row = int64_t(id) - vocab_start;
    U* dst = out + i * row_units;
    if (row >= 0 && row < v_local) {
      const U* src = weight + row * row_units;
      for (int64_t c = threadIdx.x; c < row_units; c += blockDim.x) dst[c] = src[c];
    } else {
      for (int64_t c = threadIdx.x; c < row_units; c += blockDim.x) dst[c] = U{};
    }
  }
}

template <class U>
void launch_embedding_forward(const Tensor& weight, const Tensor& tokens, const Tensor& out, int64_t vocab_start,
                              int64_t vocab_size, int* flag, cudaStream_t stream) {
  const int64_t n = tokens.numel(), v_local = weight.dim(0);
  const int64_t row_units = int64_t(weight.dim(1) * dtype_size(weight.dtype()) / sizeof(U));
  const int threads = std::min(256, round_up_warp(row_units));
  embedding_forward_kernel<U><<<unsigned(std::min(n, kMaxGrid)), threads, 0, stream>>>(
      static_cast<const U*>(weight.raw()), tokens.i32(), static_cast<U*>(out.raw()), n, row_units, vocab_start,
      v_local, vocab_size, flag);
  MT_CUDA_LAUNCH("embedding_forward_kernel");
}

/// Sort keys of the backward: the local row of each token, or v_local (sorted last, skipped)
/// for tokens this shard does not hold; values = token positions (ascending, so the stable sort
/// keeps each row's tokens in order).
__global__ void embedding_keys_kernel(const int32_t* __restrict__ tokens, int64_t n, int64_t vocab_start,
                                      int64_t v_local, uint32_t* __restrict__ keys, int32_t* __restrict__ pos) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t row = int64_t(tokens[i]) - vocab_start;
    keys[i] = row >= 0 && row < v_local ? uint32_t(row) : uint32_t(v_local);
    pos[i] = int32_t(i);
  }
}

/// Positions per chunk of the sorted keys for N tokens: a power of two ≥ 128 giving at most 256
/// chunks, so the partial sums take at most 512 rows of D floats.
int64_t embedding_chunk(int64_t n) {
  int64_t s = 128;
  while (s * 256 < n) s *= 2;
  return s;
}

/// Pass 1, one block per piece (grid-stride over positions): a piece starts at a run start or
/// at a chunk boundary inside a run, and ends at the run's or the chunk's end. Its rows are
/// summed in f32 in token order; a piece that is a whole run adds the sum to grad_weight[key],
/// the others store it in partial[chunk][slot] — slot 0 for the piece at the chunk's start of a
/// run begun earlier, slot 1 for the chunk's last piece of a run that goes on (one of each at
/// most per chunk). Threads own VEC-column slices of the row, so no two threads touch one
/// element.
template <class T, int VEC>
__global__ void __launch_bounds__(256)
    embedding_backward_pieces_kernel(const T* __restrict__ grad_out, const uint32_t* __restrict__ keys,
                                     const int32_t* __restrict__ pos, int64_t n, int d, int64_t chunk,
                                     uint32_t skip_key, float* __restrict__ grad_weight, float* __restrict__ partial) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const uint32_t key = keys[i];
    const bool begun_earlier = i > 0 && keys[i - 1] == key;
    if (key == skip_key || (begun_earlier && i % chunk != 0)) continue;  // not a piece start
    const int64_t chunk_end = min(n, (i / chunk + 1) * chunk);
    int64_t end = i + 1;
    while (end < chunk_end && keys[end] == key) ++end;
    const bool goes_on = end == chunk_end && end < n && keys[end] == key;
    const bool whole_run = !begun_earlier && !goes_on;
    float* dst = whole_run ? grad_weight + int64_t(key) * d
                           : partial + ((i / chunk) * 2 + (begun_earlier ? 0 : 1)) * int64_t(d);
    for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
      float acc[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
#pragma unroll 4
      for (int64_t r = i; r < end; ++r) {
        float g[VEC];
        load_vec<T, VEC>(grad_out + int64_t(pos[r]) * d + c, g);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += g[k];
      }
      if (whole_run) {
        float cur[VEC];
        load_vec<float, VEC>(dst + c, cur);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += cur[k];
      }
      store_vec<float, VEC>(dst + c, acc);
    }
  }
}

/// Pass 2, one block per run that crosses a chunk boundary (grid-stride over positions):
/// grad_weight[key] += partial[c0][1] + Σ_{c = c0+1 … c1} partial[c][0], in chunk order, where
/// c0 is the chunk of the run's start and c1 the last chunk whose first position is in the run.
template <int VEC>
__global__ void __launch_bounds__(256)
    embedding_backward_runs_kernel(const uint32_t* __restrict__ keys, int64_t n, int d, int64_t chunk,
                                   uint32_t skip_key, const float* __restrict__ partial,
                                   float* __restrict__ grad_weight) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const uint32_t key = keys[i];
    if (key == skip_key || (i > 0 && keys[i - 1] == key)) continue;  // not a run start
    const int64_t c0 = i / chunk;
    if ((c0 + 1) * chunk >= n || keys[(c0 + 1) * chunk] != key) continue;  // inside one chunk: done in pass 1
    int64_t c1 = c0 + 1;
    while ((c1 + 1) * chunk < n && keys[(c1 + 1) * chunk] == key) ++c1;
    float* dst = grad_weight + int64_t(key) * d;
    for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
      float acc[VEC];
      load_vec<float, VEC>(partial + (c0 * 2 + 1) * int64_t(d) + c, acc);
      for (int64_t ch = c0 + 1; ch <= c1; ++ch) {
        float g[VEC];
        load_vec<float, VEC>(partial + ch * 2 * int64_t(d) + c, g);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += g[k];
      }
      float cur[VEC];
      load_vec<float, VEC>(dst + c, cur);
#pragma unroll
      for (int k = 0; k < VEC; ++k) cur[k] += acc[k];
      store_vec<float, VEC>(dst + c, cur);
    }
  }
}

template <class T, int VEC>
void launch_embedding_backward(const Tensor& grad_out, const uint32_t* keys, const int32_t* pos, int64_t n, int d,
                               uint32_t skip_key, const Tensor& grad_weight, float* partial, cudaStream_t stream) {
  const int threads = std::min(256, round_up_warp(ceil_div(d, VEC)));
  const int64_t chunk = embedding_chunk(n);
  const unsigned grid = unsigned(std::min(n, kMaxGrid));
  embedding_backward_pieces_kernel<T, VEC><<<grid, threads, 0, stream>>>(
      static_cast<const T*>(grad_out.raw()), keys, pos, n, d, chunk, skip_key, grad_weight.f32(), partial);
  MT_CUDA_LAUNCH("embedding_backward_pieces_kernel");
  if (n <= chunk) return;  // one chunk: no run crosses a boundary
  embedding_backward_runs_kernel<VEC><<<grid, threads, 0, stream>>>(keys, n, d, chunk, skip_key, partial,
                                                                     grad_weight.f32());
  MT_CUDA_LAUNCH("embedding_backward_runs_kernel");
}

}  // namespace

/// out [N, D] = rows of weight [V_local, D] (f32 or bf16; out the same dtype) for tokens i32
/// [N] (any shape of N elements), zero rows for ids outside [vocab_start, vocab_start + V_local).
/// An id outside [0, vocab_size) sets the error flag; the next synchronizing call throws
/// std::out_of_range. @throws std::invalid_argument on shapes or dtypes.
void CudaDevice::embedding_forward(const Tensor& weight, const Tensor& tokens, const Tensor& out, int64_t vocab_start,
                                   int64_t vocab_size) {
  constexpr const char* k = "embedding_forward";
  require_defined(weight, k, "weight");
  require_defined(tokens, k, "tokens");
  require_defined(out, k, "out");
  require(weight.ndim() == 2, k, "weight must be [V_local, D], got " + shape_str(weight.shape()));
  require_float(weight, k, "weight");
  require_dtype(tokens, DType::kI32, k, "tokens");
  require_same(out, weight, k);
  const int64_t n = tokens.numel(), d = weight.dim(1);
  require_numel(out, n * d, k, "out");
  require(out.dim(-1) == d, k, "out must be [N, D] with D = " + std::to_string(d) + ", got " + shape_str(out.shape()));
  require(vocab_size <= INT_MAX, k, "vocab_size " + std::to_string(vocab_size) + " exceeds int32 ids");
  if (n == 0 || d == 0) return;
  // Widest copy unit that divides a row and keeps both tables aligned.
  const size_t row_bytes = size_t(d) * dtype_size(weight.dtype());
  auto fits = [&](size_t u) { return row_bytes % u == 0 && aligned_to(weight.raw(), u) && aligned_to(out.raw(), u); };
  if (fits(16))
    launch_embedding_forward<uint4>(weight, tokens, out, vocab_start, vocab_size, error_flag_, compute_);
  else if (fits(8))
    launch_embedding_forward<uint2>(weight, tokens, out, vocab_start, vocab_size, error_flag_, compute_);
  else if (fits(4))
    launch_embedding_forward<uint32_t>(weight, tokens, out, vocab_start, vocab_size, error_flag_, compute_);
  else
    launch_embedding_forward<uint16_t>(weight, tokens, out, vocab_start, vocab_size, error_flag_, compute_);
}

/// grad_weight [V_local, D] (f32) += grad_out [N, D] (f32 or bf16) rows scattered by tokens i32
/// [N] − vocab_start; ids outside the shard are skipped (no error: the forward checked them).
/// Deterministic (sorted, fixed-order sums; see the file comment). Temporaries: 4·N int32,
/// CUB's sort workspace and 2·⌈N / S⌉·D floats of partial sums (S = 128 or more, ≤ 256
/// chunks), from the caching allocator. @throws std::invalid_argument on shapes
/// or dtypes, or N ≥ 2³¹.
void CudaDevice::embedding_backward(const Tensor& grad_out, const Tensor& tokens, const Tensor& grad_weight,
                                    int64_t vocab_start) {
  constexpr const char* k = "embedding_backward";
  require_defined(grad_out, k, "grad_out");
  require_defined(tokens, k, "tokens");
  require_defined(grad_weight, k, "grad_weight");
  require(grad_weight.ndim() == 2, k, "grad_weight must be [V_local, D], got " + shape_str(grad_weight.shape()));
  require_dtype(grad_weight, DType::kF32, k, "grad_weight");
  require_float(grad_out, k, "grad_out");
  require_dtype(tokens, DType::kI32, k, "tokens");
  const int64_t n = tokens.numel(), d = grad_weight.dim(1), v_local = grad_weight.dim(0);
  require_numel(grad_out, n * d, k, "grad_out");
  require(n < INT_MAX && d < INT_MAX / 2, k, "more than 2^31 tokens or columns");
  require(v_local < int64_t(UINT32_MAX), k, "V_local exceeds 32-bit sort keys");
  if (n == 0 || d == 0 || v_local == 0) return;

  Tensor idx = Tensor::empty(allocator(), {4 * n}, DType::kI32, MemCategory::kTemporaries);
  auto* keys_in = reinterpret_cast<uint32_t*>(idx.i32());
  uint32_t* keys_out = keys_in + n;
  int32_t* pos_in = idx.i32() + 2 * n;
  int32_t* pos_out = idx.i32() + 3 * n;
  embedding_keys_kernel<<<grid_for(n, 256), 256, 0, compute_>>>(tokens.i32(), n, vocab_start, v_local, keys_in,
                                                               pos_in);
  MT_CUDA_LAUNCH("embedding_keys_kernel");

  int end_bit = 1;  // keys lie in [0, v_local]: sort only the bits that can be set
  while (end_bit < 32 && (uint64_t(1) << end_bit) <= uint64_t(v_local)) ++end_bit;
  size_t temp_bytes = 0;
  MT_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out, int(n), 0, end_bit,
                                          compute_));
  Tensor temp = Tensor::empty(allocator(), {ceil_div(int64_t(temp_bytes), 4) + 1}, DType::kI32,
                              MemCategory::kTemporaries);
  MT_CUDA(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, keys_in, keys_out, pos_in, pos_out, int(n), 0,
                                          end_bit, compute_));

  // Two partial rows per chunk (see the file comment); never read before pass 1 wrote them.
  const int64_t chunks = ceil_div(n, embedding_chunk(n));
  Tensor partial = Tensor::empty(allocator(), {chunks * 2 * d}, DType::kF32, MemCategory::kTemporaries);
  const bool aligned = aligned16(grad_out.raw()) && aligned16(grad_weight.raw()) && aligned16(partial.raw());
  MT_DISPATCH_FLOAT(grad_out.dtype(), T, {
    if (aligned && d % kVec<T> == 0)
      launch_embedding_backward<T, kVec<T>>(grad_out, keys_out, pos_out, n, int(d), uint32_t(v_local), grad_weight,
                                            partial.f32(), compute_);
    else
      launch_embedding_backward<T, 1>(grad_out, keys_out, pos_out, n, int(d), uint32_t(v_local), grad_weight,
                                      partial.f32(), compute_);
  });
}

}  // namespace meshtrain
