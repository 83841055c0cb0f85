#pragma once
/// @file CpuDevice: the fp32 reference backend. Matmuls through OpenBLAS (cblas_sgemm), other
/// kernels threaded with OpenMP using static schedules and fixed-order reductions, so a run is
/// bitwise reproducible for a given thread count.
#include "device/device.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace meshtrain {

/// Throws std::out_of_range("<what> id <id> outside vocab <vocab_size>") for the first of
/// ids[0, n) outside [0, vocab_size) (token ids of the embedding, target ids of the losses).
inline void check_vocab_ids(const int32_t* ids, int64_t n, int64_t vocab_size, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      throw std::out_of_range(std::string(what) + " id " + std::to_string(ids[i]) + " outside vocab " +
                              std::to_string(vocab_size));
}

class CpuDevice final : public Device {
 public:
  /// threads: OpenMP and OpenBLAS threads of this rank (>= 1).
  explicit CpuDevice(int threads);
  std::string name() const override { return "cpu"; }
  Allocator* allocator() override { return &alloc_; }
  /// Measured once: best of a few 1024³ sgemm calls with this rank's threads (FLOP/s).
  double peak_flops(bool* measured) override;
  int threads() const { return threads_; }

  void upload(const Tensor& dst, const void* host, size_t bytes) override;
  void download(void* host, const Tensor& src, size_t bytes) override;
  void* host_address(const Tensor& t) override { return t.raw(); }
  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
              float beta) override;
  void embedding_forward(const Tensor& weight, const Tensor& tokens, const Tensor& out, int64_t vocab_start,
                         int64_t vocab_size) override;
  void embedding_backward(const Tensor& grad_out, const Tensor& tokens, const Tensor& grad_weight,
                          int64_t vocab_start) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw) override;
  /// h += delta, then rmsnorm_forward(h) (two passes on the CPU; the fusion is a GPU concern).
  void add_rmsnorm_forward(const Tensor& h, const Tensor& delta, const Tensor& w, float eps, const Tensor& y,
                           const Tensor& rstd) override;
  /// rmsnorm_backward's arithmetic with residual added per element (dx may alias residual).
  void rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                 const Tensor& residual, const Tensor& dx, const Tensor& dw) override;
  /// The fused kernels' dW term alone: the same static row partition over threads() and
  /// per-thread partials summed in thread order, hence the same bits.
  void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& dw) override;
  void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         float scale, const DocumentMask& docs = {}) override;
  void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, float scale, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const DocumentMask& docs = {}) override;
  /// The causal kernel above with a key length of its own and no mask or a causal diagonal
  /// (cpu_attention.cpp): one task per (batch, head) in forward, per (batch, kv head) in backward.
  void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask,
                               const Tensor& out, const Tensor& lse, float scale,
                               const DocumentMask& docs = {}) override;
  void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b) override;
  void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                AttentionMask mask, const Tensor& out, const Tensor& lse, float scale,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const DocumentMask& docs = {}) override;
  /// Mixture-of-Experts kernels (cpu_moe.cpp): one task per token row; every sum runs in a
  /// fixed order, so results do not depend on the thread count.
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
  /// 256 tokens: about OpenBLAS's own K block, so the blocked weight-gradient GEMMs cost little more
  /// than one GEMM over every token.
  int64_t head_gemm_rows() const override { return kHeadGemmRows; }
  static constexpr int64_t kHeadGemmRows = 256;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
             const AdamWParams& p) override;
  double sum_squares(const Tensor& x) override;
  void scale(const Tensor& x, float alpha) override;
  void add(const Tensor& y, const Tensor& x, float alpha) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols) override;
  void fill(const Tensor& x, float value) override;
  void cast(const Tensor& dst, const Tensor& src) override;
  void float8_cast(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& dst) override;
  void float8_amax(const Tensor& src, Float8Scaling scaling, const Tensor& amax) override;
  void float8_cast_with_amax(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& amax,
                             const Tensor& dst) override;
  void float8_quantize_bytes(const Tensor& src, Float8Format format, bool power_of_two, const Tensor& amax,
                             const Tensor& bytes) override;
  void float8_dequantize_bytes(const Tensor& bytes, Float8Format format, bool power_of_two, const Tensor& amax,
                               const Tensor& dst) override;

 private:
  int threads_;
  CachingAllocator alloc_;
  double peak_flops_ = 0;
};

/// Sums `n` values in fixed-size blocks in a fixed order, so the result does not depend on the
/// number of threads (used by every CPU reduction that feeds the loss or the gradient norm).
double deterministic_sum(const double* v, int64_t n);

}  // namespace meshtrain
