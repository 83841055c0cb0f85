#pragma once
/// @file CudaDevice: the CUDA backend of the Device interface (DESIGN.md, Core interfaces).
/// Memory comes from a CachingAllocator over cudaMalloc (freed blocks are reused, so steady
/// state never calls the synchronizing cudaFree). Kernels run in order on one compute stream;
/// collectives run on communication streams ordered against it by events: each mesh
/// dimension's NcclCommunicator on a stream of its own (create_comm_stream; the ordering rule
/// is in comm/nccl/nccl_communicator.hpp), other transfers on comm_stream().
/// GEMMs go through cuBLASLt with fp32 accumulation; every other kernel is ours.
///
/// Dtypes: every kernel takes f32 tensors as the CPU backend does, and also bf16 for
/// activations and parameter values (all such tensors of one call share one dtype). Statistics
/// (rstd, lse, CE stats), optimizer state, master weights and accumulated gradients (dw,
/// grad_weight, matmul C with beta = 1) stay f32; kernels accumulate in f32 whatever the input.
///
/// Host synchronization happens only where a value is needed on the host: download,
/// cross_entropy / cross_entropy_combine (the loss), moe_z_loss (the router z-loss),
/// sum_squares (the gradient norm) and synchronize(). A token or target id outside the
/// vocabulary sets a device flag that the next of those calls turns into std::out_of_range.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "device/device.hpp"
#include "device/gemm_plan_cache.hpp"

namespace meshtrain {

/// Datasheet peak dense (no sparsity) bf16 tensor-core FLOP/s of a GPU named `name`
/// (cudaDeviceProp::name, matched case-insensitively) with compute capability major.minor:
/// H100 / H200 / GH200 SXM 989.4e12, H100 PCIe 756e12, H100 NVL / H200 NVL 835e12 (sm_90);
/// A100 312e12 (sm_80). Sources: NVIDIA H100, H200 and A100 datasheets (the sparse figures
/// there are twice these). 0 when unknown or when the name and compute capability disagree.
/// Throws nothing.
double datasheet_peak_bf16_flops(const std::string& name, int major, int minor);

class CudaDevice final : public Device {
 public:
  /// Selects GPU `ordinal` (cudaSetDevice on the calling thread), creates the compute and
  /// communication streams (non-blocking: they never synchronize with the legacy default
  /// stream), the cuBLASLt handle with a 32 MiB workspace, the id error flag and the caching
  /// allocator over cudaMalloc. An allocation the GPU cannot satisfy first returns the cache to
  /// the driver and retries once, then throws std::bad_alloc whose what() names the bytes
  /// requested and cudaMemGetInfo's free / total bytes.
  /// @throws std::runtime_error naming the CUDA call when the GPU cannot be used.
  explicit CudaDevice(int ordinal);
  /// Waits for every stream and frees everything; throws nothing. Every Tensor allocated on this
  /// device must be released before (their storage returns to this device's allocator).
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return "cuda"; }
  Allocator* allocator() override { return alloc_.get(); }
  /// Waits for every stream (compute and communication); throws std::out_of_range when a
  /// kernel flagged a bad token id and std::runtime_error on an asynchronous CUDA error.
  void synchronize() override;
  /// The datasheet bf16 peak of this GPU (measured = false); @throws std::runtime_error for
  /// a GPU missing from the table (MFU would be meaningless).
  double peak_flops(bool* measured) override;

  int ordinal() const { return ordinal_; }
  /// "NVIDIA H100 80GB HBM3" etc. (cudaDeviceProp::name).
  const std::string& gpu_name() const { return gpu_name_; }
  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t comm_stream() const { return comm_; }
  /// Makes the communication stream wait for all compute work queued so far (an event), so a
  /// collective launched next on comm_stream() sees the tensors the compute stream wrote. No
  /// host blocking. Call from the thread that queues work (it reuses one event).
  void comm_wait_for_compute();
  /// Makes the compute stream wait for all communication queued so far on comm_stream() (not
  /// on the streams of create_comm_stream). No host blocking.
  void compute_wait_for_comm();
  /// A new non-blocking stream for one communicator's collectives, owned by this device:
  /// synchronize() waits for it too, and it is destroyed with the device (after its work
  /// finished). Call from the thread that queues work. @throws std::runtime_error on a CUDA
  /// error.
  cudaStream_t create_comm_stream();
  /// Makes `stream` wait for all compute work queued so far (an event), as
  /// comm_wait_for_compute() does for comm_stream(). No host blocking. Call from the thread
  /// that queues work. @throws std::runtime_error on a CUDA error.
  void stream_wait_for_compute(cudaStream_t stream);

  /// Copies `bytes` (≤ dst.nbytes()) from host memory into dst, in compute-stream order. The
  /// host buffer may be reused as soon as this returns: it is copied into one of a few pinned
  /// bounce buffers (4 × 4 MiB, chunked for larger copies) whose DMA runs asynchronously, so
  /// the host blocks only when every bounce buffer still waits for its copy.
  /// @throws std::out_of_range when bytes > dst.nbytes() (as CpuDevice); std::runtime_error
  ///         on a CUDA error.
  void upload(const Tensor& dst, const void* host, size_t bytes) override;
  /// Copies `bytes` (≤ src.nbytes()) of src into host memory after all queued compute work
  /// (waits for the compute stream). @throws std::out_of_range when bytes > src.nbytes() or
  /// when a kernel flagged a bad token id; std::runtime_error on a CUDA error.
  void download(void* host, const Tensor& src, size_t bytes) override;
  /// cuBLASLt GEMM on row-major 2-D tensors with fp32 accumulation (CUBLAS_COMPUTE_32F, never
  /// TF32, so f32 matches the CPU to ~1e-5): A, B, C all f32; A, B, C bf16; or A, B bf16 with
  /// C f32 (gradient accumulation with beta = 1). Views may start at any element offset: the
  /// algorithm is chosen for the pointers' actual alignment (when cuBLASLt has none for them,
  /// misaligned operands are copied to aligned temporaries). With beta = 0, C is not read.
  /// @throws std::invalid_argument on non-2-D tensors, mismatched shapes or another dtype mix.
  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
              float beta) override;
  void embedding_forward(const Tensor& weight, const Tensor& tokens, const Tensor& out, int64_t vocab_start,
                         int64_t vocab_size) override;
  void embedding_backward(const Tensor& grad_out, const Tensor& tokens, const Tensor& grad_weight,
                          int64_t vocab_start) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw) override;
  void add_rmsnorm_forward(const Tensor& h, const Tensor& delta, const Tensor& w, float eps, const Tensor& y,
                           const Tensor& rstd) override;
  void rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                 const Tensor& residual, const Tensor& dx, const Tensor& dw) override;
  /// The backward kernel's dw part alone, on the fused kernel's grid (rmsnorm.cu): dy, x f32 or
  /// bf16, rstd and dw f32. @throws std::invalid_argument on shapes or dtypes.
  void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& dw) override;
  void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         float scale, const DocumentMask& docs = {}) override;
  void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, float scale, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const DocumentMask& docs = {}) override;
  /// The kernels of attention_forward (FlashAttention-2, Dao 2023; tensor cores for bf16 with
  /// Dh 64 or 128 and 16-byte aligned data) on one ring-attention block, unmasked or causal,
  /// with or without a document mask (key tiles wholly outside it skipped; a row that sees no
  /// key gets out 0 and lse −inf): q, k, v f32 or bf16 (one dtype); out and lse f32.
  /// @throws std::invalid_argument as Device::attention_block_forward (also for Dh odd or
  ///         outside [2, 256], or a doc_start that is not i32 [B, T] covering the block).
  void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask,
                               const Tensor& out, const Tensor& lse, float scale,
                               const DocumentMask& docs = {}) override;
  /// One warp per (b, t, h) row; out, lse, out_b, lse_b f32. A row whose lse_b is −inf is left
  /// unchanged (also when lse is −inf too, as on the CPU). @throws std::invalid_argument as
  /// Device::attention_merge.
  void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b) override;
  /// The kernels of attention_backward adding into f32 gradients, deterministic (no atomics):
  /// dout, q, k, v, out f32 or bf16 (one dtype); lse, dq, dk, dv f32. The caller's lse must be
  /// finite on every query row (it is the merged lse, which includes the row's own key).
  /// @throws std::invalid_argument as Device::attention_block_backward.
  void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                AttentionMask mask, const Tensor& out, const Tensor& lse, float scale,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const DocumentMask& docs = {}) override;
  /// Mixture-of-Experts kernels (moe.cu), same arithmetic as CpuDevice's (cpu_moe.cpp) and
  /// deterministic: no atomics, every sum in an order fixed by the shapes. The router kernels
  /// (forward, backward, z-loss, the balance-loss gradient) give each token row one warp, the
  /// top-k a warp arg-max per chosen expert; gather_rows, moe_combine and
  /// moe_combine_backward give each output (token) row one block over its columns in 16-byte
  /// vectors where alignment allows; moe_aux_stats sums fixed 256-row chunks per (sample,
  /// expert), then the chunks in order. Router tensors (logits, bias, scores, gates, dgates,
  /// dlogits, sums, coef) are f32, index tensors i32, activations f32 or bf16 (one dtype per
  /// call, f32 accumulation). Index operands are trusted, as checking them would cost a host
  /// synchronization: an index out of range is never dereferenced, and turns the outputs it
  /// feeds into NaN instead (an unknown sample id in moe_aux_stats contributes nothing).
  /// moe_z_loss synchronizes the compute stream (it returns the loss) and so, like the other
  /// synchronizing calls, throws std::out_of_range for a bad id an earlier kernel flagged; the
  /// others are asynchronous. @throws std::invalid_argument on shapes or dtypes (messages as
  /// the CPU's).
  void moe_router_forward(const Tensor& logits, const Tensor& bias, const MoeRouting& r, bool select,
                          const Tensor& scores, const Tensor& topk, const Tensor& gates) override;
  void moe_router_backward(const Tensor& dgates, const Tensor& scores, const Tensor& topk, const MoeRouting& r,
                           const Tensor& dscores_extra, const Tensor& dlogits) override;
  double moe_z_loss(const Tensor& logits, float grad_scale, const Tensor& dlogits) override;
  void moe_aux_stats(const Tensor& scores, const Tensor& sample, MoeScoreFunc f, const Tensor& sums) override;
  void moe_aux_backward(const Tensor& coef, const Tensor& sample, const Tensor& scores, MoeScoreFunc f,
                        const Tensor& dscores) override;
  void gather_rows(const Tensor& src, const Tensor& index, const Tensor& dst) override;
  void moe_combine(const Tensor& y, const Tensor& rows, const Tensor& gates, const Tensor& out) override;
  void moe_combine_backward(const Tensor& dout, const Tensor& y, const Tensor& rows, const Tensor& gates,
                            const Tensor& dy, const Tensor& dgates) override;
  void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void swiglu_backward(const Tensor& dy, const Tensor& a, const Tensor& b, const Tensor& da,
                       const Tensor& db) override;
  double cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits, float grad_scale) override;
  void cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                             const Tensor& stats) override;
  double cross_entropy_combine(const Tensor& stats_all, const Tensor& lse) override;
  void cross_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& lse,
                          const Tensor& dlogits, float grad_scale, float z_loss_coeff) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
             const AdamWParams& p) override;
  void adamw_multi(const std::vector<AdamWSegment>& segments, const AdamWParams& p) override;
  double sum_squares(const Tensor& x) override;
  void scale_to_unit_norm(const Tensor& x, double eps) override;
  double sum_squares_multi(const std::vector<Tensor>& xs, const std::vector<double>& divisors,
                           std::vector<double>* each = nullptr) override;
  void scale(const Tensor& x, float alpha) override;
  void add(const Tensor& y, const Tensor& x, float alpha) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols) override;
  void fill(const Tensor& x, float value) override;
  void cast(const Tensor& dst, const Tensor& src) override;

  // ---- Float8 training (float8.cu) ----
  /// The casts of Device::float8_cast / float8_amax / float8_cast_with_amax on the GPU, bit for
  /// bit the CPU emulation's (tensor/float8.hpp; the shared arithmetic is float8_math.hpp): src
  /// and dst f32 or bf16 (one dtype; bf16 values are widened exactly, the dequantized result
  /// rounded to bf16 to nearest even), 2-D, contiguous; amax f32 [float8_group_count]. Amax is
  /// a max over integer keys (atomicMax for tensorwise and columnwise groups), so it is exact
  /// and deterministic; a group holding a NaN or ±inf gets +inf, whose scale 0 turns every value
  /// of the group into NaN (the CPU's float8_cast turns them into NaN through a NaN scale: same
  /// values, NaN payloads aside). Asynchronous. @throws std::invalid_argument on dtypes or
  /// shapes.
  void float8_cast(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& dst) override;
  void float8_amax(const Tensor& src, Float8Scaling scaling, const Tensor& amax) override;
  void float8_cast_with_amax(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& amax,
                             const Tensor& dst) override;
  /// Device::float8_quantize_bytes / float8_dequantize_bytes (the FP8 all-gather of FSDP shards):
  /// one elementwise kernel each on the compute stream, the rounding and codes of float8_math.hpp,
  /// so bit for bit the CPU device's. Errors as there.
  void float8_quantize_bytes(const Tensor& src, Float8Format format, bool power_of_two, const Tensor& amax,
                             const Tensor& bytes) override;
  void float8_dequantize_bytes(const Tensor& bytes, Float8Format format, bool power_of_two, const Tensor& amax,
                               const Tensor& dst) override;
  /// Float8 GEMM (Device::float8_matmul). emulate, or an operand left in high precision: the
  /// emulation (Device's default, on these casts and a bf16 / f32 matmul). Otherwise real FP8
  /// GEMMs through cuBLASLt (NVIDIA cuBLAS documentation, cublasLtMatmul, "FP8" requirements;
  /// TorchAO's torch._scaled_mm calls): each operand is cast to e4m3 / e5m2 bytes in the layout
  /// Hopper's FP8 kernels need (both operands K-major, "TN"; a transposing cast where the stored
  /// operand is not), leading dimension padded to 16 bytes, with its scales; fp32 accumulation
  /// (CUBLAS_COMPUTE_32F, fast accumulation off); D = C of c's dtype (bf16 or f32).
  ///   tensorwise × tensorwise: one cuBLASLt call with the dequantization scales 1/s as
  ///     CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER, alpha and beta into c directly;
  ///   a rowwise / columnwise operand: one unscaled FP8 GEMM into an f32 temporary [M, N], then
  ///     c = alpha · acc · (1/s_a[i]) · (1/s_b[j]) + beta · c (exact factorisation: every group
  ///     spans the reduction dimension). cuBLASLt's outer-vector scale mode
  ///     (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) is not used: CUDA 13 documents it without
  ///     promising sm_90 kernels, and this path needs none.
  /// A group must span the reduction dimension (op(A) per row, op(B) per column, or tensorwise:
  /// every TorchAO recipe's GEMMs). A problem cuBLASLt has no FP8 algorithm for (e5m2 × e5m2, a
  /// misaligned C that no temporary can fix) runs the emulation instead, said once per process
  /// on stderr; float8_gemm_stats counts both kinds. Asynchronous.
  /// @throws std::runtime_error on a GPU below compute capability 8.9 (no FP8 tensor cores),
  ///         naming [quantize.linear.float8] emulate = true as the way out; std::invalid_argument
  ///         on shapes, dtypes or a scaling group along an output dimension.
  void float8_matmul(const Float8Operand& a, bool trans_a, const Float8Operand& b, bool trans_b, bool power_of_two,
                     bool emulate, const Tensor& c, float alpha, float beta) override;
  /// Counts of float8_matmul calls with both operands quantized and emulate = false.
  struct Float8GemmStats {
    int64_t fp8 = 0;       ///< ran as cuBLASLt FP8 GEMMs
    int64_t emulated = 0;  ///< cuBLASLt had no FP8 algorithm: emulated
  };
  Float8GemmStats float8_gemm_stats();

  /// Device-side error flag (first bad id + 1, 0 = none) the id-checking kernels set.
  int* error_flag() const { return error_flag_; }

  /// The matmul plan cache's state, for tests and diagnostics.
  struct MatmulCacheStats {
    int64_t heuristic_calls = 0;  ///< cublasLtMatmulAlgoGetHeuristic calls so far
    size_t plans = 0;             ///< exact problems cached now (≤ plan_capacity)
    size_t plan_capacity = 0;
    int64_t plan_evictions = 0;
    size_t algorithms = 0;        ///< bucketed problems with a cached heuristic answer
  };
  MatmulCacheStats matmul_cache_stats();

 private:
  /// Throws std::out_of_range("token id N is outside the vocabulary ...") when a kernel flagged
  /// a bad id since the last check, and clears the flag. Reads the flag in compute-stream
  /// order (waits for the compute stream), so it may be called at any time.
  void check_error_flag();
  /// fp64 scratch for reductions returned to the host: returns device memory of ≥ n doubles
  /// and makes host_scratch_ (pinned) hold ≥ n doubles too. Grown on demand; the old buffers
  /// are freed only after the compute stream drained, so kernels queued earlier never see a
  /// freed buffer. The pointers stay valid until the next call with a larger n.
  double* reduce_scratch(int64_t n);
  /// Queues Σ x² (fp64; f32 or bf16 x, numel > 0) on the compute stream: per-block partials in
  /// the reduce scratch, then their fixed-order sum; returns the device address of the total.
  double* queue_sum_squares(const Tensor& x);

  /// A cached cuBLASLt matmul: descriptors of one exact problem and the algorithm it runs.
  struct MatmulPlan;
  /// The heuristic's answer for one bucketed problem (usable = false: no algorithm).
  struct MatmulAlgo {
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
  };
  /// (m, n, k, trans_a, trans_b, A/B dtype, C dtype, alignment of A, B, C in bytes ≤ 256).
  /// alpha and beta are not part of it: the heuristic does not see them, and an algorithm is
  /// valid for any scalars.
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int, int, int>;
  /// The plan of `key` (thread-safe): from the LRU cache of exact problems, else built with the
  /// algorithm the heuristic chose for the key with m and k bucketed (gemm_size_bucket; asked
  /// once per bucket), when cublasLtMatmulAlgoCheck accepts it for the exact sizes and our
  /// workspace — otherwise the heuristic is asked for the exact sizes. plan.usable is false when
  /// cuBLASLt has no algorithm. @throws std::runtime_error on a cuBLASLt error.
  std::shared_ptr<const MatmulPlan> matmul_plan(const PlanKey& key);
  /// The descriptors (operation, layouts) of `key`'s problem, no algorithm yet.
  std::unique_ptr<MatmulPlan> matmul_descriptors(const PlanKey& key);
  /// cublasLtMatmulAlgoGetHeuristic's best algorithm for `plan`'s descriptors and `key`'s
  /// alignments. Counts heuristic_calls. @throws std::runtime_error on a cuBLASLt error.
  MatmulAlgo matmul_heuristic(const MatmulPlan& plan, const PlanKey& key);
  /// An operand of an FP8 GEMM as cuBLASLt reads it (float8.cu): bytes [rows, ld] (K-major,
  /// ld = K rounded up to 16) in an i32 tensor used as raw storage, and the dequantization
  /// scales 1/s [1 or rows].
  struct Float8Bytes {
    Tensor bytes, inv_scale;
    cudaDataType_t type{};
    bool per_row = false;
  };
  /// Casts o (stored [R, C]) to the K-major bytes of a GEMM operand with `rows` = R (transpose
  /// false) or C (true). @throws std::invalid_argument for a scaling group along the output.
  Float8Bytes float8_bytes(const Float8Operand& o, bool transpose, bool power_of_two, const char* which);
  /// D[M, N] (row-major, dtype d_type, ld N) = alpha · (a · bᵀ) · scales + beta · D on cuBLASLt's
  /// FP8 kernels, a and b K-major [M, ld] / [N, ld]; with `scaled`, their tensorwise inverse
  /// scales as A/B scale pointers. Returns false, launching nothing, when cuBLASLt has no
  /// algorithm. @throws std::runtime_error on a cuBLASLt error.
  bool float8_lt_matmul(const Float8Bytes& a, const Float8Bytes& b, int64_t m, int64_t n, int64_t k, bool scaled,
                        void* d, DType d_type, float alpha, float beta);
  /// Frees every CUDA resource this object holds (null handles skipped); throws nothing.
  void release_resources() noexcept;

  int ordinal_ = 0;
  std::string gpu_name_;
  int cc_major_ = 0, cc_minor_ = 0;
  std::unique_ptr<CachingAllocator> alloc_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  std::vector<cudaStream_t> comm_streams_;  // create_comm_stream()'s, one per communicator
  cudaEvent_t compute_done_ = nullptr, comm_done_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int* error_flag_ = nullptr;
  double* scratch_ = nullptr;
  double* host_scratch_ = nullptr;  // pinned
  int64_t scratch_n_ = 0;
  std::mutex plan_mu_;
  // Exact problems seen recently (a bound: MoE's row counts change every step) and the
  // heuristic's algorithms per bucketed problem (bounded by the buckets: 8 per octave of m, k).
  static constexpr size_t kMaxMatmulPlans = 1024;
  LruCache<PlanKey, std::shared_ptr<MatmulPlan>> plans_{kMaxMatmulPlans};
  std::map<PlanKey, MatmulAlgo> algos_;
  int64_t heuristic_calls_ = 0;
  // FP8 GEMM algorithms per exact problem (m, n, k, A type, B type, D type, scaled, D alignment),
  // under plan_mu_; cleared when it outgrows kMaxMatmulPlans (linear layers have few shapes).
  using Float8Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, bool, int>;
  std::map<Float8Key, MatmulAlgo> float8_algos_;
  Float8GemmStats float8_stats_;
  // Pinned bounce buffers of upload(), used round-robin; stage_done_[i] is recorded on the
  // compute stream after the copy out of buffer i, so the buffer is refilled only after it.
  static constexpr int kStageSlots = 4;
  static constexpr size_t kStageBytes = size_t(4) << 20;
  std::mutex stage_mu_;
  std::array<void*, kStageSlots> stage_buf_{};
  std::array<cudaEvent_t, kStageSlots> stage_done_{};
  int stage_next_ = 0;
};

}  // namespace meshtrain
