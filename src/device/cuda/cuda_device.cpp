// CudaDevice core: construction and teardown, the caching allocator over cudaMalloc, streams and
// events, host transfers, the id error flag, reduction scratch, and GEMMs through cuBLASLt. The
// kernel families live in the .cu files beside this one.
#include "device/cuda/cuda_device.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "device/cuda/cuda_check.hpp"

namespace meshtrain {

namespace {

/// std::bad_alloc carrying the sizes that explain it (std::bad_alloc itself has no message).
class CudaOutOfMemory final : public std::bad_alloc {
 public:
  explicit CudaOutOfMemory(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

/// The largest power of two ≤ 256 dividing the address: what cuBLASLt's MIN_ALIGNMENT
/// preferences compare against (its default assumes 256, true only for fresh cudaMalloc blocks).
int pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % uintptr_t(align) != 0) align >>= 1;
  return align;
}

cudaDataType_t lt_type(DType d) { return d == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

void check_transfer(const Tensor& t, size_t bytes, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + " with an undefined tensor");
  // out_of_range, as CpuDevice: callers above device/ must see the same exception on every backend.
  if (bytes > t.nbytes())
    throw std::out_of_range(std::string(what) + " of " + std::to_string(bytes) + " bytes with a tensor of " +
                            std::to_string(t.nbytes()) + " bytes");
}

/// Restores the calling thread's current device on scope exit, so allocating from another
/// thread (whose current device may differ) neither fails nor changes that thread's state.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != ordinal) MT_CUDA(cudaSetDevice(ordinal));
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace

double datasheet_peak_bf16_flops(const std::string& name, int major, int minor) {
  const std::string n = lower(name);
  // Hopper (sm_90): the name distinguishes the form factors, which differ in clocks and SM count.
  // "gh200" contains "h200" and has the SXM H100/H200 compute.
  if (major == 9 && minor == 0 && (contains(n, "h100") || contains(n, "h200") || contains(n, "h800"))) {
    if (contains(n, "pcie")) return 756e12;
    if (contains(n, "nvl")) return 835e12;
    return 989.4e12;  // SXM5 / HGX / GH200
  }
  if (major == 8 && minor == 0 && (contains(n, "a100") || contains(n, "a800"))) return 312e12;
  return 0;
}

struct CudaDevice::MatmulPlan {
  cublasLtMatmulDesc_t op = nullptr;
  // cuBLASLt's operands after the row-major → column-major swap: lt_a views our B, lt_b our A,
  // lt_c our C (which is also D: the product is written in place).
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // false: the heuristic found no algorithm for this key
  MatmulPlan() = default;
  MatmulPlan(const MatmulPlan&) = delete;
  MatmulPlan& operator=(const MatmulPlan&) = delete;
  ~MatmulPlan() {
    if (lt_c) cublasLtMatrixLayoutDestroy(lt_c);
    if (lt_b) cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a) cublasLtMatrixLayoutDestroy(lt_a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  try {
    MT_CUDA(cudaSetDevice(ordinal_));
    cudaDeviceProp prop{};
    MT_CUDA(cudaGetDeviceProperties(&prop, ordinal_));
    gpu_name_ = prop.name;
    cc_major_ = prop.major;
    cc_minor_ = prop.minor;
    // Non-blocking: work on these streams never serializes with stray legacy-default-stream
    // calls (a library's cudaMemset, say).
    MT_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    MT_CUDA(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    MT_CUDA(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    MT_CUDA(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
    MT_CUDA(cublasLtCreate(&lt_));
    workspace_bytes_ = size_t(32) << 20;  // cuBLASLt's split-K / stream-K algorithms need up to tens of MiB on Hopper
    MT_CUDA(cudaMalloc(&workspace_, workspace_bytes_));
    MT_CUDA(cudaMalloc(&error_flag_, sizeof(int)));
    // On compute_, not with cudaMemset: the legacy default stream does not order against our
    // non-blocking streams, so a plain memset could land after a kernel already set the flag.
    MT_CUDA(cudaMemsetAsync(error_flag_, 0, sizeof(int), compute_));
    MT_CUDA(cudaStreamSynchronize(compute_));

    const int dev = ordinal_;
    alloc_ = std::make_unique<CachingAllocator>(
        [this, dev](size_t bytes) -> void* {
          DeviceGuard guard(dev);
          void* p = nullptr;
          cudaError_t e = cudaMalloc(&p, bytes);
          if (e == cudaSuccess) return p;
          (void)cudaGetLastError();  // out of memory is not sticky: clear it so later checks do not see it
          if (e != cudaErrorMemoryAllocation) cuda::check(e, "cudaMalloc", __FILE__, __LINE__);
          // CachingAllocator::allocate calls us without holding its lock, so releasing is safe;
          // cudaFree synchronizes the device, so no queued kernel still uses a released block.
          alloc_->release_cache();
          e = cudaMalloc(&p, bytes);
          if (e == cudaSuccess) return p;
          (void)cudaGetLastError();
          if (e != cudaErrorMemoryAllocation) cuda::check(e, "cudaMalloc", __FILE__, __LINE__);
          size_t free_b = 0, total_b = 0;
          if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
          throw CudaOutOfMemory("CUDA out of memory on GPU " + std::to_string(dev) + ": cudaMalloc of " +
                                std::to_string(bytes) + " bytes (" + mib(bytes) + ") failed after releasing the " +
                                "allocator's cache; cudaMemGetInfo: " + std::to_string(free_b) + " bytes (" +
                                mib(free_b) + ") free of " + std::to_string(total_b) + " (" + mib(total_b) + ")");
        },
        [](void* p, size_t) {
          if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();  // called from destructors: never throw
        });
  } catch (...) {
    release_resources();
    throw;
  }
}

CudaDevice::~CudaDevice() { release_resources(); }

void CudaDevice::release_resources() noexcept {
  if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
  if (compute_) (void)cudaStreamSynchronize(compute_);
  if (comm_) (void)cudaStreamSynchronize(comm_);
  for (cudaStream_t st : comm_streams_) (void)cudaStreamSynchronize(st);
  alloc_.reset();  // returns the cached blocks (cudaFree)
  plans_.clear();  // before the cuBLASLt handle they belong to
  for (int i = 0; i < kStageSlots; ++i) {
    if (stage_buf_[size_t(i)]) (void)cudaFreeHost(stage_buf_[size_t(i)]);
    if (stage_done_[size_t(i)]) (void)cudaEventDestroy(stage_done_[size_t(i)]);
    stage_buf_[size_t(i)] = nullptr;
    stage_done_[size_t(i)] = nullptr;
  }
  if (scratch_) (void)cudaFree(scratch_);
  if (host_scratch_) (void)cudaFreeHost(host_scratch_);
  if (error_flag_) (void)cudaFree(error_flag_);
  if (workspace_) (void)cudaFree(workspace_);
  if (lt_) (void)cublasLtDestroy(lt_);
  if (compute_done_) (void)cudaEventDestroy(compute_done_);
  if (comm_done_) (void)cudaEventDestroy(comm_done_);
  if (compute_) (void)cudaStreamDestroy(compute_);
  if (comm_) (void)cudaStreamDestroy(comm_);
  for (cudaStream_t st : comm_streams_) (void)cudaStreamDestroy(st);
  comm_streams_.clear();
  scratch_ = nullptr, host_scratch_ = nullptr, scratch_n_ = 0;
  error_flag_ = nullptr, workspace_ = nullptr, lt_ = nullptr;
  compute_done_ = comm_done_ = nullptr;
  compute_ = comm_ = nullptr;
  (void)cudaGetLastError();
}

void CudaDevice::synchronize() {
  MT_CUDA(cudaStreamSynchronize(comm_));
  for (cudaStream_t st : comm_streams_) MT_CUDA(cudaStreamSynchronize(st));
  MT_CUDA(cudaStreamSynchronize(compute_));
  // A launch error some caller did not check would otherwise go unnoticed until it corrupts
  // results; cudaErrorNotReady is a query answer, not an error.
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess && e != cudaErrorNotReady) cuda::check(e, "an earlier CUDA call (cudaGetLastError)", __FILE__, __LINE__);
  check_error_flag();
}

double CudaDevice::peak_flops(bool* measured) {
  if (measured) *measured = false;
  const double p = datasheet_peak_bf16_flops(gpu_name_, cc_major_, cc_minor_);
  if (p <= 0)
    throw std::runtime_error("no datasheet bf16 peak FLOP/s for GPU '" + gpu_name_ + "' (sm_" +
                             std::to_string(cc_major_) + std::to_string(cc_minor_) +
                             "); MFU cannot be computed (known: A100, H100 SXM/PCIe/NVL, H200, GH200)");
  return p;
}

void CudaDevice::comm_wait_for_compute() {
  MT_CUDA(cudaEventRecord(compute_done_, compute_));
  MT_CUDA(cudaStreamWaitEvent(comm_, compute_done_, 0));
}

cudaStream_t CudaDevice::create_comm_stream() {
  MT_CUDA(cudaSetDevice(ordinal_));
  cudaStream_t st = nullptr;
  MT_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  comm_streams_.push_back(st);
  return st;
}

void CudaDevice::stream_wait_for_compute(cudaStream_t stream) {
  // One event serves every stream: cudaStreamWaitEvent captures the work recorded so far.
  MT_CUDA(cudaEventRecord(compute_done_, compute_));
  MT_CUDA(cudaStreamWaitEvent(stream, compute_done_, 0));
}

void CudaDevice::compute_wait_for_comm() {
  MT_CUDA(cudaEventRecord(comm_done_, comm_));
  MT_CUDA(cudaStreamWaitEvent(compute_, comm_done_, 0));
}

void CudaDevice::upload(const Tensor& dst, const void* host, size_t bytes) {
  check_transfer(dst, bytes, "upload");
  if (bytes == 0) return;
  // Pinned bounce buffers instead of cudaMemcpyAsync straight from pageable memory: for pageable
  // sources CUDA only says the call "might be synchronous", so the caller's buffer could still be
  // read after we return; a cudaStreamSynchronize would make it safe but stall the host behind
  // every queued kernel at each batch upload. Copying into a free bounce buffer makes the
  // caller's buffer reusable at once while the DMA stays asynchronous and stream-ordered.
  std::lock_guard<std::mutex> lock(stage_mu_);
  if (!stage_buf_[0]) {
    for (int i = 0; i < kStageSlots; ++i) {
      MT_CUDA(cudaMallocHost(&stage_buf_[size_t(i)], kStageBytes));
      MT_CUDA(cudaEventCreateWithFlags(&stage_done_[size_t(i)], cudaEventDisableTiming));
    }
  }
  char* d = static_cast<char*>(dst.raw());
  const char* h = static_cast<const char*>(host);
  for (size_t off = 0; off < bytes; off += kStageBytes) {
    const size_t n = std::min(kStageBytes, bytes - off);
    const size_t s = size_t(stage_next_);
    stage_next_ = (stage_next_ + 1) % kStageSlots;
    // Returns at once for a never-recorded event; otherwise waits until the previous copy out of
    // this buffer has run, so refilling it cannot change data still in flight.
    MT_CUDA(cudaEventSynchronize(stage_done_[s]));
    std::memcpy(stage_buf_[s], h + off, n);
    MT_CUDA(cudaMemcpyAsync(d + off, stage_buf_[s], n, cudaMemcpyHostToDevice, compute_));
    MT_CUDA(cudaEventRecord(stage_done_[s], compute_));
  }
}

void CudaDevice::download(void* host, const Tensor& src, size_t bytes) {
  check_transfer(src, bytes, "download");
  if (bytes > 0) MT_CUDA(cudaMemcpyAsync(host, src.raw(), bytes, cudaMemcpyDeviceToHost, compute_));
  MT_CUDA(cudaStreamSynchronize(compute_));  // pageable destinations are filled only once the copy ran
  check_error_flag();
}

void CudaDevice::check_error_flag() {
  int flag = 0;
  MT_CUDA(cudaMemcpyAsync(&flag, error_flag_, sizeof(int), cudaMemcpyDeviceToHost, compute_));
  MT_CUDA(cudaStreamSynchronize(compute_));
  if (flag == 0) return;
  // Cleared in stream order: kernels queued later set it afresh, earlier ones already ran.
  MT_CUDA(cudaMemsetAsync(error_flag_, 0, sizeof(int), compute_));
  throw std::out_of_range("token id " + std::to_string(int64_t(flag) - 1) +
                          " is outside the vocabulary (flagged by a CUDA kernel; ids must lie in [0, vocab_size))");
}

double* CudaDevice::reduce_scratch(int64_t n) {
  if (n < 1) n = 1;
  if (n <= scratch_n_) return scratch_;
  // Kernels queued earlier may still write the old buffers, and a device-to-host copy may still
  // fill the pinned one.
  MT_CUDA(cudaStreamSynchronize(compute_));
  const int64_t want = std::max<int64_t>({n, 2 * scratch_n_, 1024});  // geometric growth: few reallocations
  if (scratch_) (void)cudaFree(scratch_);
  if (host_scratch_) (void)cudaFreeHost(host_scratch_);
  scratch_ = nullptr, host_scratch_ = nullptr, scratch_n_ = 0;  // consistent if an allocation below throws
  MT_CUDA(cudaMalloc(&scratch_, size_t(want) * sizeof(double)));
  void* h = nullptr;
  MT_CUDA(cudaMallocHost(&h, size_t(want) * sizeof(double)));
  host_scratch_ = static_cast<double*>(h);
  scratch_n_ = want;
  return scratch_;
}

void CudaDevice::matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
                        float beta) {
  const auto [m, n, k] = matmul_dims(a, trans_a, b, trans_b, c);
  const DType ab = a.dtype(), ct = c.dtype();
  const bool ok = b.dtype() == ab && ((ab == DType::kF32 && ct == DType::kF32) ||
                                      (ab == DType::kBF16 && (ct == DType::kBF16 || ct == DType::kF32)));
  if (!ok)
    throw std::invalid_argument(std::string("matmul dtypes A ") + dtype_name(ab) + ", B " + dtype_name(b.dtype()) +
                                ", C " + dtype_name(ct) +
                                ": supported are all float32, all bfloat16, or bfloat16 A and B with float32 C");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = beta·C; cuBLASLt rejects the zero leading dimensions of A and B
    if (beta == 0.0f) MT_CUDA(cudaMemsetAsync(c.raw(), 0, c.nbytes(), compute_));
    else if (beta != 1.0f) scale(c, beta);
    return;
  }
  const int al_a = pointer_alignment(a.raw()), al_b = pointer_alignment(b.raw()), al_c = pointer_alignment(c.raw());
  const auto launch = [&](const MatmulPlan& p, const void* ap, const void* bp, void* cp) {
    // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B goes first (see matmul_plan).
    MT_CUDA(cublasLtMatmul(lt_, p.op, &alpha, bp, p.lt_a, ap, p.lt_b, &beta, cp, p.lt_c, cp, p.lt_c, &p.algo,
                           workspace_, workspace_bytes_, compute_));
  };
  const std::shared_ptr<const MatmulPlan> p = matmul_plan({m, n, k, trans_a, trans_b, int(ab), int(ct), al_a, al_b, al_c});
  if (p->usable) return launch(*p, a.raw(), b.raw(), c.raw());
  // No algorithm for these alignments (views at odd element offsets): copy each misaligned
  // operand into a fresh, 256-byte aligned block. Everything runs on the compute stream, so the
  // temporaries may return to the cache when this scope ends.
  const std::shared_ptr<const MatmulPlan> q = matmul_plan({m, n, k, trans_a, trans_b, int(ab), int(ct), 256, 256, 256});
  if (!q->usable || (al_a == 256 && al_b == 256 && al_c == 256))
    throw std::runtime_error("cuBLASLt has no algorithm for matmul M=" + std::to_string(m) + " N=" +
                             std::to_string(n) + " K=" + std::to_string(k) + " trans_a=" + std::to_string(trans_a) +
                             " trans_b=" + std::to_string(trans_b) + " A/B " + dtype_name(ab) + " C " +
                             dtype_name(ct));
  const auto aligned = [&](const Tensor& t, int align, bool copy_in) {
    if (align == 256) return t;
    Tensor tmp = empty(t.shape(), t.dtype(), MemCategory::kTemporaries);
    if (copy_in) MT_CUDA(cudaMemcpyAsync(tmp.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToDevice, compute_));
    return tmp;
  };
  const Tensor a2 = aligned(a, al_a, true), b2 = aligned(b, al_b, true);
  const Tensor c2 = aligned(c, al_c, beta != 0.0f);  // with beta = 0, C is not read
  launch(*q, a2.raw(), b2.raw(), c2.raw());
  if (al_c != 256) MT_CUDA(cudaMemcpyAsync(c.raw(), c2.raw(), c.nbytes(), cudaMemcpyDeviceToDevice, compute_));
}

std::shared_ptr<const CudaDevice::MatmulPlan> CudaDevice::matmul_plan(const PlanKey& key) {
  std::lock_guard<std::mutex> lock(plan_mu_);
  if (std::shared_ptr<MatmulPlan>* hit = plans_.find(key)) return *hit;
  std::shared_ptr<MatmulPlan> p = matmul_descriptors(key);
  // The algorithm is chosen once per bucket of m and k (the extents MoE's row counts vary):
  // cuBLASLt's kernels handle any extent up to the one they were picked for, and
  // cublasLtMatmulAlgoCheck confirms that for the exact descriptors and our workspace.
  PlanKey bucket = key;
  std::get<0>(bucket) = gemm_size_bucket(std::get<0>(key));
  std::get<2>(bucket) = gemm_size_bucket(std::get<2>(key));
  auto it = algos_.find(bucket);
  if (it == algos_.end())
    it = algos_.emplace(bucket, matmul_heuristic(bucket == key ? *p : *matmul_descriptors(bucket), bucket)).first;
  bool fits = it->second.usable;
  if (fits && bucket != key) {
    cublasLtMatmulHeuristicResult_t check{};
    fits = cublasLtMatmulAlgoCheck(lt_, p->op, p->lt_a, p->lt_b, p->lt_c, p->lt_c, &it->second.algo, &check) ==
               CUBLAS_STATUS_SUCCESS &&
           check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= workspace_bytes_;
  }
  if (fits) {
    p->algo = it->second.algo;
    p->usable = true;
  } else if (it->second.usable) {  // the bucket's algorithm does not fit these exact sizes
    const MatmulAlgo exact = matmul_heuristic(*p, key);
    p->algo = exact.algo;
    p->usable = exact.usable;
  }
  return plans_.insert(key, std::move(p));
}

std::unique_ptr<CudaDevice::MatmulPlan> CudaDevice::matmul_descriptors(const PlanKey& key) {
  const auto [m, n, k, ta, tb, ab_i, c_i, al_a, al_b, al_c] = key;  // alignments: the heuristic's
  const cudaDataType_t abt = lt_type(DType(ab_i)), ct = lt_type(DType(c_i));
  auto p = std::make_unique<MatmulPlan>();
  // fp32 accumulation and fp32 alpha/beta for every dtype mix. CUBLAS_COMPUTE_32F (not
  // _FAST_TF32) keeps f32 inputs at full precision.
  MT_CUDA(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt is column-major. A row-major [R, C] matrix with ld = C is the column-major [C, R]
  // matrix with ld = C, i.e. its transpose. So cuBLASLt computes the column-major [N, M] result
  // D = op_a(Bᵀ-view) · op_b(Aᵀ-view) with op_a = trans_b and op_b = trans_a:
  //   lt_a: our B seen column-major: [b.dim(1), b.dim(0)] = trans_b ? [K, N] : [N, K], ld = rows
  //   lt_b: our A seen column-major: [a.dim(1), a.dim(0)] = trans_a ? [M, K] : [K, M], ld = rows
  //   lt_c: our C seen column-major: [N, M], ld = N
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUDA(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  MT_CUDA(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const uint64_t a_rows = uint64_t(tb ? k : n), a_cols = uint64_t(tb ? n : k);
  const uint64_t b_rows = uint64_t(ta ? m : k), b_cols = uint64_t(ta ? k : m);
  MT_CUDA(cublasLtMatrixLayoutCreate(&p->lt_a, abt, a_rows, a_cols, int64_t(a_rows)));
  MT_CUDA(cublasLtMatrixLayoutCreate(&p->lt_b, abt, b_rows, b_cols, int64_t(b_rows)));
  MT_CUDA(cublasLtMatrixLayoutCreate(&p->lt_c, ct, uint64_t(n), uint64_t(m), int64_t(n)));
  return p;
}

CudaDevice::MatmulAlgo CudaDevice::matmul_heuristic(const MatmulPlan& plan, const PlanKey& key) {
  const int align_a = std::get<7>(key), align_b = std::get<8>(key), align_c = std::get<9>(key);
  ++heuristic_calls_;
  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUDA(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } pref_guard{pref};
  const uint64_t ws = workspace_bytes_;
  MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // Views start at any element offset, so pointers may be aligned to as little as one element.
  // Stating the real alignments excludes algorithms that would load misaligned vectors
  // (cuBLASLt assumes 256 bytes by default). lt_a is our B, lt_b our A.
  const uint32_t al_lt_a = uint32_t(align_b), al_lt_b = uint32_t(align_a), al_c = uint32_t(align_c);
  MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_lt_a,
                                               sizeof al_lt_a));
  MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_lt_b,
                                               sizeof al_lt_b));
  MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
  MT_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.lt_a, plan.lt_b, plan.lt_c, plan.lt_c, pref, 1, &result, &found);
  // NOT_SUPPORTED means no algorithm fits (cached as unusable: the caller stages through aligned
  // copies); other failures are real errors.
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
    cuda::check(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  MatmulAlgo out;
  out.usable = st == CUBLAS_STATUS_SUCCESS && found >= 1 && result.state == CUBLAS_STATUS_SUCCESS;
  if (out.usable) out.algo = result.algo;
  return out;
}

CudaDevice::MatmulCacheStats CudaDevice::matmul_cache_stats() {
  std::lock_guard<std::mutex> lock(plan_mu_);
  MatmulCacheStats st;
  st.heuristic_calls = heuristic_calls_;
  st.plans = plans_.size();
  st.plan_capacity = plans_.capacity();
  st.plan_evictions = plans_.evictions();
  st.algorithms = algos_.size();
  return st;
}

}  // namespace meshtrain
