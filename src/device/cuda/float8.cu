// Float8 training on the GPU (TorchAO's float8 recipes, tensor/float8.hpp): the operand casts —
// amax per scaling group, quantize → dequantize (the emulation, bit for bit the CPU's), quantize
// to e4m3 / e5m2 bytes in the layout cuBLASLt's FP8 GEMMs read — and those GEMMs
// (CudaDevice::float8_matmul). The rounding arithmetic is float8_math.hpp's, shared with the
// CPU unit test that checks it against tensor/float8.cpp.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/float8_math.hpp"
#include "device/cuda/kernel_common.cuh"

namespace meshtrain {

namespace {
using namespace cuda;

constexpr int kThreads = 256;
constexpr int kTile = 32, kTileRows = 8;

static_assert(int(Float8Scaling::kTensorwise) == 0 && int(Float8Scaling::kRowwise) == 1 &&
                  int(Float8Scaling::kColumnwise) == 2,
              "group_of reads Float8Scaling as 0 / 1 / 2");

f8::Format format_of(Float8Format f) { return f == Float8Format::kE4M3 ? f8::e4m3() : f8::e5m2(); }

// The scaling group of stored element (r, c): 0 (tensorwise), r (rowwise) or c (columnwise).
__device__ __forceinline__ int64_t group_of(int scaling, int64_t r, int64_t c) {
  return scaling == 1 ? r : scaling == 2 ? c : 0;
}

__device__ __forceinline__ uint32_t warp_max_u(uint32_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Max over a block of kThreads threads; valid in thread 0. One call per kernel (no reuse of part).
__device__ __forceinline__ uint32_t block_max_u(uint32_t v) {
  __shared__ uint32_t part[kThreads / 32];
  v = warp_max_u(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) v = warp_max_u(threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0u);
  return v;
}

// Amax keys (f8::amax_key) of each row of x [rows, cols]: one block per row.
template <class T>
__global__ void amax_rows_kernel(const T* x, int64_t cols, uint32_t* amax) {
  const T* row = x + int64_t(blockIdx.x) * cols;
  uint32_t m = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = max(m, f8::amax_key(to_f(row[c])));
  m = block_max_u(m);
  if (threadIdx.x == 0) amax[blockIdx.x] = m;
}

// Amax keys of each column: a thread per column over `chunk` rows (blockIdx.y picks them),
// folded into amax (zeroed first) with atomicMax.
template <class T>
__global__ void amax_cols_kernel(const T* x, int64_t rows, int64_t cols, int64_t chunk, uint32_t* amax) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = int64_t(blockIdx.y) * chunk, r1 = min(rows, r0 + chunk);
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r) m = max(m, f8::amax_key(to_f(x[r * cols + c])));
  if (m) atomicMax(&amax[c], m);
}

// Amax key of the whole tensor (grid-stride), folded into amax[0] (zeroed first).
template <class T>
__global__ void amax_all_kernel(const T* x, int64_t n, uint32_t* amax) {
  uint32_t m = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = max(m, f8::amax_key(to_f(x[i])));
  m = block_max_u(m);
  if (threadIdx.x == 0 && m) atomicMax(amax, m);
}

// scale[g] = f8::scale(amax[g]) and, when inv is set, inv[g] = 1 / scale[g] (the dequantization
// factor an FP8 GEMM applies).
__global__ void scales_kernel(const float* amax, int64_t groups, f8::Format f, bool power_of_two, float* scale,
                              float* inv) {
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    const float s = f8::scale(amax[g], f, power_of_two);
    scale[g] = s;
    if (inv) inv[g] = 1.0f / s;
  }
}

// out = round(x · s) / s per element with s its group's scale (float8_quantize_with_amax's
// arithmetic); out may be x.
template <class T>
__global__ void fake_quantize_kernel(const T* x, T* out, int64_t n, int64_t cols, int scaling, const float* scale,
                                     f8::Format f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    const float s = scale[group_of(scaling, r, i - r * cols)];
    out[i] = from_f<T>(f8::round(to_f(x[i]) * s, f) / s);
  }
}

// The codes of round(x · s) for x [rows, cols], written to out[r, c] (transpose false) or
// out[c, r] (true) with row stride ld. One 32×32 tile per block (blockDim 32×8); a transposing
// cast goes through shared memory so that reads and writes both run along rows.
template <class T>
__global__ void quantize_bytes_kernel(const T* x, int64_t rows, int64_t cols, int scaling, const float* scale,
                                      f8::Format f, bool transpose, uint8_t* out, int64_t ld) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t col_tiles = ceil_div(cols, kTile);
  const int64_t r0 = int64_t(blockIdx.x) / col_tiles * kTile, c0 = int64_t(blockIdx.x) % col_tiles * kTile;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float s = scale[group_of(scaling, r, c)];
      const uint8_t code = f8::encode(f8::round(to_f(x[r * cols + c]) * s, f), f);
      if (transpose)
        tile[j][threadIdx.x] = code;
      else
        out[r * ld + c] = code;
    }
  }
  if (!transpose) return;  // uniform over the block
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;  // tile[r − r0][c − c0]
    if (r < rows && c < cols) out[c * ld + r] = tile[threadIdx.x][j];
  }
}

// bytes[i] = code of round(x[i] · s), s = f8::scale(amax[0]) (the FSDP FP8 all-gather's send side).
template <class T>
__global__ void quantize_flat_kernel(const T* x, int64_t n, const float* amax, f8::Format f, bool power_of_two,
                                     uint8_t* bytes) {
  const float s = f8::scale(amax[0], f, power_of_two);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bytes[i] = f8::encode(f8::round(to_f(x[i]) * s, f), f);
}

// out[i] = decode(bytes[i]) / s (its receive side): fake_quantize_kernel's value for the same code.
template <class T>
__global__ void dequantize_flat_kernel(const uint8_t* bytes, int64_t n, const float* amax, f8::Format f,
                                       bool power_of_two, T* out) {
  const float s = f8::scale(amax[0], f, power_of_two);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(f8::decode(bytes[i], f) / s);
}

// c[i, j] = alpha · acc[i, j] · inv_a[i or 0] · inv_b[j or 0] (+ beta · c[i, j] unless beta is 0,
// when c is not read): the scales of a rowwise FP8 GEMM applied after its unscaled product.
template <class T>
__global__ void scale_outer_kernel(const float* acc, int64_t m, int64_t n, const float* inv_a, bool a_per_row,
                                   const float* inv_b, bool b_per_col, float alpha, float beta, T* c) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, col = i - r * n;
    float v = alpha * acc[i] * inv_a[a_per_row ? r : 0] * inv_b[b_per_col ? col : 0];
    if (beta != 0.0f) v += beta * to_f(c[i]);
    c[i] = from_f<T>(v);
  }
}

void check_operand(const char* k, const Tensor& src, const Tensor& dst) {
  require(src.ndim() == 2 && src.shape() == dst.shape() && src.dtype() == dst.dtype(), k,
          "needs contiguous src and dst of one 2-D shape and dtype; got " + std::string(dtype_name(src.dtype())) +
              " " + shape_str(src.shape()) + " and " + dtype_name(dst.dtype()) + " " + shape_str(dst.shape()));
  require_float(src, k, "src");
}
void check_amax(const char* k, const Tensor& src, Float8Scaling scaling, const Tensor& amax) {
  require_dtype(amax, DType::kF32, k, "amax");
  require_numel(amax, float8_group_count(src.dim(0), src.dim(1), scaling), k, "amax");
}

// The group amax of src [R, C] into amax f32 [groups] (as raw keys, which are the floats' bits).
void launch_amax(const Tensor& src, Float8Scaling scaling, const Tensor& amax, cudaStream_t st) {
  const int64_t rows = src.dim(0), cols = src.dim(1);
  auto* keys = static_cast<uint32_t*>(amax.raw());
  if (scaling != Float8Scaling::kRowwise || src.numel() == 0)
    MT_CUDA(cudaMemsetAsync(keys, 0, amax.nbytes(), st));
  if (src.numel() == 0) return;
  MT_DISPATCH_FLOAT(src.dtype(), T, {
    const T* x = static_cast<const T*>(src.raw());
    if (scaling == Float8Scaling::kRowwise) {
      amax_rows_kernel<T><<<unsigned(rows), kThreads, 0, st>>>(x, cols, keys);
    } else if (scaling == Float8Scaling::kColumnwise) {
      const int64_t chunk = std::max<int64_t>(64, ceil_div(rows, 65535));
      const dim3 grid(unsigned(ceil_div(cols, kThreads)), unsigned(ceil_div(rows, chunk)));
      amax_cols_kernel<T><<<grid, kThreads, 0, st>>>(x, rows, cols, chunk, keys);
    } else {
      amax_all_kernel<T><<<grid_for(src.numel(), kThreads, 4096), kThreads, 0, st>>>(x, src.numel(), keys);
    }
  });
  MT_CUDA_LAUNCH("float8 amax");
}

void launch_scales(const Tensor& amax, Float8Format f, bool power_of_two, const Tensor& scale, const Tensor& inv,
                   cudaStream_t st) {
  const int64_t groups = amax.numel();
  if (groups == 0) return;
  scales_kernel<<<grid_for(groups, kThreads), kThreads, 0, st>>>(
      amax.f32(), groups, format_of(f), power_of_two, scale.f32(), inv.defined() ? inv.f32() : nullptr);
  MT_CUDA_LAUNCH("float8 scales");
}

// The alignment in bytes (≤ 256, a power of two) of a device address, for cuBLASLt's preferences.
int address_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a % 256 == 0 ? 256 : int(a & (~a + 1));
}

}  // namespace

void CudaDevice::float8_amax(const Tensor& src, Float8Scaling scaling, const Tensor& amax) {
  check_operand("float8_amax", src, src);
  check_amax("float8_amax", src, scaling, amax);
  launch_amax(src, scaling, amax, compute_);
}

void CudaDevice::float8_cast_with_amax(const Tensor& src, const Float8Cast& cast, bool power_of_two,
                                       const Tensor& amax, const Tensor& dst) {
  const char* k = "float8_cast_with_amax";
  check_operand(k, src, dst);
  require(cast.quantize, k, "the cast does not quantize");
  check_amax(k, src, cast.scaling, amax);
  if (src.numel() == 0) return;
  Tensor scale = empty(amax.shape(), DType::kF32, MemCategory::kTemporaries);
  launch_scales(amax, cast.format, power_of_two, scale, Tensor(), compute_);
  MT_DISPATCH_FLOAT(src.dtype(), T, {
    fake_quantize_kernel<T><<<grid_for(src.numel(), kThreads), kThreads, 0, compute_>>>(
        static_cast<const T*>(src.raw()), static_cast<T*>(dst.raw()), src.numel(), src.dim(1), int(cast.scaling),
        scale.f32(), format_of(cast.format));
  });
  MT_CUDA_LAUNCH("float8 fake quantize");
}

namespace {
void check_byte_cast(const char* k, const Tensor& hp, const Tensor& amax, const Tensor& bytes) {
  require_float(hp, k, "the high-precision tensor");
  require_dtype(amax, DType::kF32, k, "amax");
  require_numel(amax, 1, k, "amax");
  require_dtype(bytes, DType::kI32, k, "bytes");
  require(bytes.numel() * 4 >= hp.numel(), k, "bytes holds fewer than " + std::to_string(hp.numel()) + " codes");
}
}  // namespace

void CudaDevice::float8_quantize_bytes(const Tensor& src, Float8Format format, bool power_of_two, const Tensor& amax,
                                       const Tensor& bytes) {
  check_byte_cast("float8_quantize_bytes", src, amax, bytes);
  if (src.numel() == 0) return;
  MT_DISPATCH_FLOAT(src.dtype(), T, {
    quantize_flat_kernel<T><<<grid_for(src.numel(), kThreads), kThreads, 0, compute_>>>(
        static_cast<const T*>(src.raw()), src.numel(), amax.f32(), format_of(format), power_of_two,
        static_cast<uint8_t*>(bytes.raw()));
  });
  MT_CUDA_LAUNCH("float8 quantize bytes");
}

void CudaDevice::float8_dequantize_bytes(const Tensor& bytes, Float8Format format, bool power_of_two,
                                         const Tensor& amax, const Tensor& dst) {
  check_byte_cast("float8_dequantize_bytes", dst, amax, bytes);
  if (dst.numel() == 0) return;
  MT_DISPATCH_FLOAT(dst.dtype(), T, {
    dequantize_flat_kernel<T><<<grid_for(dst.numel(), kThreads), kThreads, 0, compute_>>>(
        static_cast<const uint8_t*>(bytes.raw()), dst.numel(), amax.f32(), format_of(format), power_of_two,
        static_cast<T*>(dst.raw()));
  });
  MT_CUDA_LAUNCH("float8 dequantize bytes");
}

void CudaDevice::float8_cast(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& dst) {
  check_operand("float8_cast", src, dst);
  if (!cast.quantize) {
    if (dst.raw() != src.raw()) copy(dst, src);
    return;
  }
  Tensor amax = empty({float8_group_count(src.dim(0), src.dim(1), cast.scaling)}, DType::kF32,
                      MemCategory::kTemporaries);
  launch_amax(src, cast.scaling, amax, compute_);
  float8_cast_with_amax(src, cast, power_of_two, amax, dst);
}

CudaDevice::Float8Bytes CudaDevice::float8_bytes(const Float8Operand& o, bool transpose, bool power_of_two,
                                                 const char* which) {
  const Tensor& x = o.src;
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const Float8Scaling along_k = transpose ? Float8Scaling::kColumnwise : Float8Scaling::kRowwise;
  require(o.cast.scaling == Float8Scaling::kTensorwise || o.cast.scaling == along_k, "float8_matmul",
          std::string(which) + " is scaled per " +
              (o.cast.scaling == Float8Scaling::kRowwise ? "row" : "column") +
              " along an output dimension of the GEMM, which an FP8 GEMM cannot factor out");
  const int64_t groups = float8_group_count(rows, cols, o.cast.scaling);
  Tensor amax = o.amax;
  if (amax.defined()) {
    check_amax("float8_matmul", x, o.cast.scaling, amax);
  } else {
    amax = empty({groups}, DType::kF32, MemCategory::kTemporaries);
    launch_amax(x, o.cast.scaling, amax, compute_);
  }
  Float8Bytes b;
  b.type = o.cast.format == Float8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  b.per_row = o.cast.scaling != Float8Scaling::kTensorwise;
  b.inv_scale = empty({groups}, DType::kF32, MemCategory::kTemporaries);
  const Tensor scale = empty({groups}, DType::kF32, MemCategory::kTemporaries);
  launch_scales(amax, o.cast.format, power_of_two, scale, b.inv_scale, compute_);
  const int64_t out_rows = transpose ? cols : rows, k = transpose ? rows : cols, ld = ceil_div(k, 16) * 16;
  b.bytes = empty({ceil_div(out_rows * ld, 4)}, DType::kI32, MemCategory::kTemporaries);
  // cuBLASLt reads only the first k bytes of each row; zeroing the padding keeps it defined.
  if (ld != k) MT_CUDA(cudaMemsetAsync(b.bytes.raw(), 0, b.bytes.nbytes(), compute_));
  const int64_t tiles = ceil_div(rows, kTile) * ceil_div(cols, kTile);
  MT_DISPATCH_FLOAT(x.dtype(), T, {
    quantize_bytes_kernel<T><<<unsigned(tiles), dim3(kTile, kTileRows), 0, compute_>>>(
        static_cast<const T*>(x.raw()), rows, cols, int(o.cast.scaling), scale.f32(), format_of(o.cast.format),
        transpose, static_cast<uint8_t*>(b.bytes.raw()), ld);
  });
  MT_CUDA_LAUNCH("float8 quantize bytes");
  return b;
}

bool CudaDevice::float8_lt_matmul(const Float8Bytes& a, const Float8Bytes& b, int64_t m, int64_t n, int64_t k,
                                  bool scaled, void* d, DType d_type, float alpha, float beta) {
  const int64_t ld = ceil_div(k, 16) * 16;
  const cudaDataType_t dt = d_type == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  struct Descriptors {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    ~Descriptors() {
      if (ld) cublasLtMatrixLayoutDestroy(ld);
      if (lb) cublasLtMatrixLayoutDestroy(lb);
      if (la) cublasLtMatrixLayoutDestroy(la);
      if (op) cublasLtMatmulDescDestroy(op);
    }
  } desc;
  MT_CUDA(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Row-major D [M, N] is column-major Dᵀ [N, M] = Bq · Aqᵀ, where the K-major byte matrices
  // Bq [N, ld] and Aq [M, ld] read column-major are [K, N] and [K, M] with leading dimension ld:
  // cuBLASLt's A is our b under op T, its B our a under op N — the "TN" layout FP8 requires.
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  MT_CUDA(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
  MT_CUDA(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
  if (scaled) {  // the attribute's value is the device pointer itself
    const float* sa = b.inv_scale.f32();  // cuBLASLt's A
    const float* sb = a.inv_scale.f32();
    MT_CUDA(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    MT_CUDA(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  }
  // K as padded: FP8 kernels want K a multiple of 16 (cuBLASLt offered none for K = 200 on an
  // H200), and the padding bytes are zeros (float8_bytes), which add nothing to the products.
  MT_CUDA(cublasLtMatrixLayoutCreate(&desc.la, b.type, uint64_t(ld), uint64_t(n), ld));
  MT_CUDA(cublasLtMatrixLayoutCreate(&desc.lb, a.type, uint64_t(ld), uint64_t(m), ld));
  MT_CUDA(cublasLtMatrixLayoutCreate(&desc.ld, dt, uint64_t(n), uint64_t(m), n));
  const int align_d = address_alignment(d);
  MatmulAlgo algo;
  {
    std::lock_guard<std::mutex> lock(plan_mu_);
    const Float8Key key{m, n, k, int(a.type), int(b.type), int(dt), scaled, align_d};
    auto it = float8_algos_.find(key);
    if (it == float8_algos_.end()) {
      if (float8_algos_.size() >= kMaxMatmulPlans) float8_algos_.clear();
      cublasLtMatmulPreference_t pref = nullptr;
      MT_CUDA(cublasLtMatmulPreferenceCreate(&pref));
      struct PrefGuard {
        cublasLtMatmulPreference_t p;
        ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
      } guard{pref};
      const uint64_t ws = workspace_bytes_;
      const uint32_t al_ab = 256, al_d = uint32_t(align_d);  // the byte matrices are fresh blocks
      MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_ab,
                                                   sizeof al_ab));
      MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_ab,
                                                   sizeof al_ab));
      MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                   sizeof al_d));
      MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                   sizeof al_d));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, desc.op, desc.la, desc.lb, desc.ld, desc.ld, pref,
                                                               1, &result, &found);
      // NOT_SUPPORTED (and INVALID_VALUE, which some cuBLASLt versions give for an FP8 type pair
      // they lack) mean "no FP8 kernel for this problem"; other failures are errors.
      if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
        cuda::check(st, "cublasLtMatmulAlgoGetHeuristic (FP8)", __FILE__, __LINE__);
      MatmulAlgo found_algo;
      found_algo.usable = st == CUBLAS_STATUS_SUCCESS && found >= 1 && result.state == CUBLAS_STATUS_SUCCESS;
      if (found_algo.usable) found_algo.algo = result.algo;
      it = float8_algos_.emplace(key, found_algo).first;
    }
    algo = it->second;
  }
  if (!algo.usable) return false;
  MT_CUDA(cublasLtMatmul(lt_, desc.op, &alpha, b.bytes.raw(), desc.la, a.bytes.raw(), desc.lb, &beta, d, desc.ld, d,
                         desc.ld, &algo.algo, workspace_, workspace_bytes_, compute_));
  return true;
}

void CudaDevice::float8_matmul(const Float8Operand& a, bool trans_a, const Float8Operand& b, bool trans_b,
                               bool power_of_two, bool emulate, const Tensor& c, float alpha, float beta) {
  if (emulate || !a.cast.quantize || !b.cast.quantize)
    return Device::float8_matmul(a, trans_a, b, trans_b, power_of_two, emulate, c, alpha, beta);
  if (cc_major_ * 10 + cc_minor_ < 89)
    throw std::runtime_error("float8 training with [quantize.linear.float8] emulate = false needs FP8 tensor cores "
                             "(compute capability 8.9 or newer: Ada, Hopper); GPU '" +
                             gpu_name_ + "' is sm_" + std::to_string(cc_major_) + std::to_string(cc_minor_) +
                             ": set [quantize.linear.float8] emulate = true to emulate it (quantize -> dequantize, "
                             "high-precision GEMMs)");
  const auto [m, n, k] = matmul_dims(a.src, trans_a, b.src, trans_b, c);
  require_float(a.src, "float8_matmul", "A");
  require_float(b.src, "float8_matmul", "B");
  require_float(c, "float8_matmul", "C");
  if (m == 0 || n == 0 || k == 0)  // nothing for FP8 kernels to do: the emulation handles the edge cases
    return Device::float8_matmul(a, trans_a, b, trans_b, power_of_two, true, c, alpha, beta);
  const Float8Bytes qa = float8_bytes(a, trans_a, power_of_two, "A");
  const Float8Bytes qb = float8_bytes(b, !trans_b, power_of_two, "B");
  const auto count = [&](bool fp8) {
    std::lock_guard<std::mutex> lock(plan_mu_);
    ++(fp8 ? float8_stats_.fp8 : float8_stats_.emulated);
  };
  if (!qa.per_row && !qb.per_row && float8_lt_matmul(qa, qb, m, n, k, true, c.raw(), c.dtype(), alpha, beta))
    return count(true);
  Tensor acc = empty({m, n}, DType::kF32, MemCategory::kTemporaries);
  if (float8_lt_matmul(qa, qb, m, n, k, false, acc.raw(), DType::kF32, 1.0f, 0.0f)) {
    MT_DISPATCH_FLOAT(c.dtype(), T, {
      scale_outer_kernel<T><<<grid_for(m * n, kThreads), kThreads, 0, compute_>>>(
          acc.f32(), m, n, qa.inv_scale.f32(), qa.per_row, qb.inv_scale.f32(), qb.per_row, alpha, beta,
          static_cast<T*>(c.raw()));
    });
    MT_CUDA_LAUNCH("float8 outer scales");
    return count(true);
  }
  count(false);
  // Not silent: the deck asked for FP8 GEMMs. Once per process, so a step does not print per GEMM.
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr,
                 "warning: float8: cuBLASLt offers no FP8 kernel for a %lld x %lld x %lld GEMM on '%s'; such GEMMs "
                 "run the emulation (quantize -> dequantize, high-precision GEMM) instead\n",
                 static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), gpu_name_.c_str());
  });
  Device::float8_matmul(a, trans_a, b, trans_b, power_of_two, true, c, alpha, beta);
}

CudaDevice::Float8GemmStats CudaDevice::float8_gemm_stats() {
  std::lock_guard<std::mutex> lock(plan_mu_);
  return float8_stats_;
}

}  // namespace meshtrain
