#pragma once
/// @file Device: memory (a caching allocator with per-category accounting) and one method per
/// kernel family. CpuDevice (fp32, OpenBLAS, OpenMP) is the reference; CudaDevice (bf16 + fp32
/// master, cuBLASLt, own kernels) implements the same interface. Code above device/ never
/// branches on the backend. Unless stated, tensors are f32, contiguous, and outputs are
/// overwritten; "accumulates" means += into the output. The CUDA backend also accepts bf16 for
/// activations and parameter values (see cuda_device.hpp); statistics, optimizer state and
/// accumulated gradients are f32 on every backend.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/float8.hpp"
#include "tensor/tensor.hpp"

namespace meshtrain {

/// Hyper-parameters of one AdamW update (Loshchilov & Hutter 2019, Algorithm 2, as in
/// torch.optim.AdamW): p -= lr·wd·p; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
/// p -= (lr / (1−β1^t)) · m / (sqrt(v / (1−β2^t)) + eps), with g = grad_scale · gradient.
struct AdamWParams {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;  ///< t, counting from 1
  /// Multiplies every gradient element as it is read (global-norm clipping's coefficient,
  /// clip_coefficient in optim/adamw.hpp); the gradient tensors are not written. g · 1 = g, so
  /// 1 changes nothing, and any scale gives the bits of scaling the gradients first.
  float grad_scale = 1.0f;
};

/// One tensor of a multi-tensor AdamW step: flat f32 views of equal numel and its weight decay.
/// `compute`, when defined, is a bf16 [n] tensor that receives the updated param rounded to
/// nearest even, as cast(compute, param) after the step would write it: the mixed-precision
/// compute copy comes out of the optimizer's pass instead of a separate cast pass.
struct AdamWSegment {
  Tensor param, grad, exp_avg, exp_avg_sq;
  float weight_decay = 0;
  Tensor compute;
};

/// The mask of one attention block (Device::attention_block_forward): kNone, every query sees
/// every key; kCausal, the diagonal block of a causal sequence (query t sees keys s ≤ t).
enum class AttentionMask { kNone, kCausal };

/// Document masking of one attention call (TorchTitan's attn_mask_type = "block_causal"): on top
/// of the causal rule, query position p sees key position s only when both lie in the same
/// document of their packed sample. Documents are contiguous, so the keys a query sees form one
/// range [doc_start[b, p], p] and kernels skip every key outside it, forward and backward.
/// doc_start i32 [B, T] on the device holds, for each sample b and each position p of the whole
/// sequence (global positions 0 … T − 1, whatever the context-parallel split), the position of
/// the first token of p's document (a document ends with, and includes, its EOS token).
/// q_offset / k_offset are the global positions of the call's first query / first key row, so a
/// context-parallel block (one query chunk against one key chunk) reads the same table.
/// An undefined doc_start (the default) means no document mask: plain causal attention.
/// host_starts, when set, is the same [B, T] table in host memory: callers that split attention
/// into blocks (context parallelism) read it to skip blocks wholly outside the mask; kernels
/// read doc_start only.
struct DocumentMask {
  Tensor doc_start;
  int64_t q_offset = 0, k_offset = 0;
  const int32_t* host_starts = nullptr;
  bool active() const { return doc_start.defined(); }
};

/// Score function of a Mixture-of-Experts router: softmax over the experts (Qwen3-MoE, Mixtral)
/// or an independent sigmoid per expert (DeepSeek-V3).
enum class MoeScoreFunc { kSoftmax, kSigmoid };

/// Token-choice top-k routing (Device::moe_router_forward; Shazeer et al. 2017, with the
/// gate rules of DeepSeek-V3, Liu et al. 2024, eq. 12-16).
struct MoeRouting {
  MoeScoreFunc score_func = MoeScoreFunc::kSoftmax;
  int64_t top_k = 1;
  bool route_norm = false;   ///< chosen gates divided by their sum (+ 1e-20), as TorchTitan
  float route_scale = 1.0f;  ///< gates multiplied by this after route_norm
};

/// The three products of a grouped GEMM over row groups (Device::grouped_matmul): group g
/// owns rows [o_g, o_g + counts[g]) of the token-major operands and slab g of the grouped
/// weight W [G, P, Q].
enum class GroupedGemm {
  kForward,        ///< C[rows_g, P] = A[rows_g, Q] · W_gᵀ            (y = x·Wᵀ per expert)
  kBackwardInput,  ///< C[rows_g, Q] = A[rows_g, P] · W_g             (dx = dy·W)
  kBackwardWeight  ///< W_g[P, Q] += A[rows_g, P]ᵀ · B[rows_g, Q]   (dW += dyᵀ·x; C unused)
};

/// One operand of Device::float8_matmul: the high-precision tensor as stored (2-D, row-major,
/// f32 or the activation dtype) and its cast. amax, when defined, holds the amax of its scaling
/// groups already reduced over the ranks that share them (float8_amax, then an all-reduce with
/// max: tensor parallelism); undefined, the device computes it from src alone.
struct Float8Operand {
  Tensor src;
  Float8Cast cast;
  Tensor amax;
};

/// {M, N, K} of C[M, N] = op(A)[M, K] · op(B)[K, N] (Device::matmul's operands).
/// @throws std::invalid_argument unless A, B, C are 2-D with matching extents.
struct MatmulDims {
  int64_t m, n, k;
};
MatmulDims matmul_dims(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c);

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  /// The caching allocator of this device; every Tensor on it comes from here.
  virtual Allocator* allocator() = 0;
  /// Waits for all queued work (CPU: nothing to wait for).
  virtual void synchronize() {}
  /// Peak fp32/bf16 FLOP/s of this device for MFU; `measured` says whether it was measured
  /// (CPU: sgemm calibration) or taken from a datasheet table.
  virtual double peak_flops(bool* measured) = 0;

  Tensor empty(const Shape& s, DType d, MemCategory c) { return Tensor::empty(allocator(), s, d, c); }
  Tensor zeros(const Shape& s, DType d, MemCategory c) {
    Tensor t = empty(s, d, c);
    fill(t, 0.0f);
    return t;
  }

  // ---- host transfers ----
  /// Copies `bytes` from host memory into dst (any dtype).
  virtual void upload(const Tensor& dst, const void* host, size_t bytes) = 0;
  /// Copies `bytes` of src into host memory.
  virtual void download(void* host, const Tensor& src, size_t bytes) = 0;
  /// The host address of t's first element when this device's memory is host memory (CPU), so
  /// file I/O can read into or write from it without a staging copy; nullptr when it is not
  /// (CUDA), and callers then stage through upload / download.
  virtual void* host_address(const Tensor& t) { return (void)t, nullptr; }

  // ---- dense algebra ----
  /// C[M, N] = alpha · op(A) · op(B) + beta · C, with op(X) = X or Xᵀ; A, B, C 2-D.
  /// @throws std::invalid_argument on mismatched shapes.
  virtual void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
                      float beta) = 0;

  // ---- model kernels ----
  /// out[N, D] = weight[tokens[n] − vocab_start, :] for token ids in [vocab_start,
  /// vocab_start + V_local), zero rows for the others (a vocab-parallel shard of the table);
  /// weight [V_local, D], tokens i32 [N]. @throws std::out_of_range for an id outside
  /// [0, vocab_size).
  virtual void embedding_forward(const Tensor& weight, const Tensor& tokens, const Tensor& out, int64_t vocab_start,
                                 int64_t vocab_size) = 0;
  /// grad_weight[V_local, D] accumulates grad_out[n, :] into row tokens[n] − vocab_start for
  /// the ids this shard holds (others are skipped).
  virtual void embedding_backward(const Tensor& grad_out, const Tensor& tokens, const Tensor& grad_weight,
                                  int64_t vocab_start) = 0;
  /// RMSNorm over the last dim (Zhang & Sennrich 2019): y = x · rstd · w, rstd[n] =
  /// 1/sqrt(mean(x[n]²) + eps); x, y [N, D], w [D], rstd [N] (saved for backward).
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) = 0;
  /// dx[N, D] overwritten; dw[D] accumulates. An undefined dw skips the weight term (the split
  /// backward of zero-bubble pipeline schedules, which computes it later with
  /// rmsnorm_backward_weight); dx is bitwise the same either way.
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                const Tensor& dx, const Tensor& dw) = 0;
  /// The residual add fused with the RMSNorm that follows it (a transformer block's
  /// h = x + attention(…); ffn_norm(h)): h += delta in place, then y = rmsnorm(h) · w exactly as
  /// rmsnorm_forward (rstd saved). h, delta, y [N, D]; w [D]; rstd [N]. One pass over h.
  virtual void add_rmsnorm_forward(const Tensor& h, const Tensor& delta, const Tensor& w, float eps, const Tensor& y,
                                   const Tensor& rstd) = 0;
  /// rmsnorm_backward plus the residual branch's gradient: dx = residual + ∂(rmsnorm)/∂x·dy,
  /// dw accumulates (undefined dw: skipped, as in rmsnorm_backward). dx may alias residual
  /// (element-wise read before write). dy, x, residual, dx [N, D]; w [D]; rstd [N].
  virtual void rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                         const Tensor& residual, const Tensor& dx, const Tensor& dw) = 0;
  /// The weight term of rmsnorm_backward alone, deferred by a split backward ("W" of Qi et al.
  /// 2023, Zero Bubble Pipeline Parallelism): dw[D] accumulates Σ_n dy[n, :]·x[n, :]·rstd[n];
  /// dy, x [N, D] (x the forward's input), rstd f32 [N] from the forward, dw f32 [D]. Same bits
  /// as the dW term of the fused kernels on the same device and inputs (same row partition and
  /// summation order), so a split backward reproduces a fused one exactly (CUDA: under the
  /// alignment and occupancy conditions in cuda/rmsnorm.cu).
  /// @throws std::invalid_argument on mismatched shapes or dtypes.
  virtual void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& dw) = 0;
  /// Rotary embedding in place on x [B, T, H, Dh], pairs (2j, 2j+1) rotated by angle θ[t, j]
  /// (Su et al. 2021; Meta's interleaved layout); cos, sin [T, Dh/2]. inverse = rotate by −θ
  /// (the backward pass, since the map is orthogonal).
  virtual void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) = 0;
  /// Causal grouped-query attention, flash style (Dao et al. 2022): q [B, T, Hq, Dh],
  /// k, v [B, T, Hkv, Dh], out [B, T, Hq, Dh], lse [B, Hq, T] log-sum-exp of scaled scores
  /// (saved for backward). Query head h reads kv head h / (Hq / Hkv). scale = 1/sqrt(Dh).
  /// docs: document masking (DocumentMask; default none). A query row that sees no key cannot
  /// occur here (every position sees itself).
  /// @throws std::invalid_argument on mismatched shapes or a doc_start that is not i32 [B, T].
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const Tensor& lse, float scale, const DocumentMask& docs = {}) = 0;
  /// Gradients of attention_forward: dq overwritten [B, T, Hq, Dh], dk, dv overwritten
  /// [B, T, Hkv, Dh]; recomputes probabilities from q, k and lse.
  virtual void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, float scale, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv, const DocumentMask& docs = {}) = 0;
  // ---- block attention (context parallelism: ring / all-gather attention) ----
  /// One block of causal grouped-query attention whose queries and keys are different slices of
  /// the sequence, as a ring step or an all-gathered key chunk sees them (Liu et al. 2023, Ring
  /// Attention; Brandon et al. 2023, Striped / zigzag balancing). q [B, Tq, Hq, Dh] (activation
  /// dtype), k, v [B, Tk, Hkv, Dh]. mask kNone: every query attends every key (a key chunk
  /// wholly before the query chunk); kCausal: the diagonal block, Tq == Tk, query t attends
  /// keys s ≤ t. Writes out f32 [B, Tq, Hq, Dh] (this block's normalized output, f32 whatever
  /// the activation dtype, so that merges stay exact) and lse f32 [B, Hq, Tq] (log-sum-exp of
  /// the block's scaled scores). Query head h reads kv head h / (Hq / Hkv).
  /// docs (default none) masks keys of other documents as well; a query row that then sees no
  /// key of this block gets out 0 and lse −inf, which attention_merge skips.
  /// @throws std::invalid_argument on mismatched shapes or dtypes, or kCausal with Tq != Tk.
  virtual void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask,
                                       const Tensor& out, const Tensor& lse, float scale,
                                       const DocumentMask& docs = {}) = 0;
  /// Merges one block's partial result into the running one with the log-sum-exp rule, in f32
  /// (the rule of Milakov & Gimelshein 2018, as Ring Attention applies it): with
  /// σ(x) = 1 / (1 + e^(−x)), out ← out − σ(lse_b − lse)·(out − out_b), then
  /// lse ← lse − log σ(lse − lse_b). out, out_b f32 [B, T, H, Dh]; lse, lse_b f32 [B, H, T].
  /// A row whose lse is −inf (nothing seen yet) takes the block's values.
  /// @throws std::invalid_argument on mismatched shapes or dtypes.
  virtual void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b) = 0;
  /// Backward of one block given the merged forward: dout, out [B, Tq, Hq, Dh] (activation
  /// dtype) are the gradient and value of the attention output over all key blocks, lse f32
  /// [B, Hq, Tq] the log-sum-exp over all of them (the external lse), so that the block's
  /// probabilities exp(s − lse) are the global ones (Dao 2023, FlashAttention-2, Algorithm 2,
  /// with D = rowsum(dout ∘ out)). q, k, v and mask as in attention_block_forward.
  /// Accumulates (+=) into dq f32 [B, Tq, Hq, Dh] and dk, dv f32 [B, Tk, Hkv, Dh]: the sum over
  /// blocks of these calls is the full gradient.
  /// @throws std::invalid_argument on mismatched shapes or dtypes, or kCausal with Tq != Tk.
  virtual void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                        AttentionMask mask, const Tensor& out, const Tensor& lse, float scale,
                                        const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                        const DocumentMask& docs = {}) = 0;
  // ---- Mixture of Experts ----
  /// Router of a MoE layer. logits f32 [N, E] (the gate's x·Wᵀ); scores f32 [N, E] receives
  /// softmax(logits) per row or sigmoid(logits) per element (r.score_func). With `select` the
  /// experts of token n are the top_k largest of scores[n, :] + bias (bias f32 [E], used only to
  /// choose, DeepSeek-V3's auxiliary-loss-free balancing; undefined = 0), in descending order,
  /// ties to the lower expert index, written to topk i32 [N, k]; without it topk is an input
  /// (e.g. round-robin routing for tests). gates f32 [N, k] = route_scale · scores[n, topk]
  /// (divided by their row sum + 1e-20 when route_norm): the unbiased scores.
  /// @throws std::invalid_argument on mismatched shapes or top_k outside [1, E].
  virtual void moe_router_forward(const Tensor& logits, const Tensor& bias, const MoeRouting& r, bool select,
                                  const Tensor& scores, const Tensor& topk, const Tensor& gates) = 0;
  /// Backward of moe_router_forward: from dgates f32 [N, k] (and dscores_extra f32 [N, E], a
  /// gradient reaching the scores directly, e.g. from the balance loss; undefined = 0) writes
  /// dlogits f32 [N, E] (overwritten) through route_scale, route_norm and the score function.
  /// scores and topk are the forward's. @throws std::invalid_argument on mismatched shapes.
  virtual void moe_router_backward(const Tensor& dgates, const Tensor& scores, const Tensor& topk,
                                   const MoeRouting& r, const Tensor& dscores_extra, const Tensor& dlogits) = 0;
  /// Router z-loss (Zoph et al. 2022, ST-MoE, eq. 5) before its coefficient and mean: returns
  /// Σ_n lse_n² (fp64, fixed order) with lse_n = log Σ_e exp(logits[n, e]); when dlogits f32
  /// [N, E] is defined it accumulates grad_scale · 2·lse_n·softmax(logits[n, :]).
  virtual double moe_z_loss(const Tensor& logits, float grad_scale, const Tensor& dlogits) = 0;
  /// Per-sequence score sums of the sequence-wise balance loss (DeepSeek-V3, eq. 17-20):
  /// sums f32 [S, E] (overwritten) [s, e] = Σ_{n: sample[n] = s} s'[n, e], where s' = scores
  /// for softmax and scores / Σ_e scores[n, e] for sigmoid; scores f32 [N, E], sample i32 [N]
  /// in [0, S). Summed in row order. @throws std::invalid_argument on mismatched shapes.
  virtual void moe_aux_stats(const Tensor& scores, const Tensor& sample, MoeScoreFunc f, const Tensor& sums) = 0;
  /// Gradient of Σ_n Σ_e coef[sample[n], e] · s'[n, e] w.r.t. scores: dscores f32 [N, E]
  /// (overwritten); coef f32 [S, E], other operands as moe_aux_stats.
  virtual void moe_aux_backward(const Tensor& coef, const Tensor& sample, const Tensor& scores, MoeScoreFunc f,
                                const Tensor& dscores) = 0;
  /// dst[r, :] = src[index[r], :]: src [N, D], index i32 [R] in [0, N), dst [R, D] (same dtype;
  /// the dispatch of tokens into expert order). @throws std::invalid_argument on mismatched
  /// shapes; std::out_of_range for an index outside [0, N).
  virtual void gather_rows(const Tensor& src, const Tensor& index, const Tensor& dst) = 0;
  /// Combine of the expert outputs into token order: out[n, :] = Σ_j g[n, j] · y[rows[n, j], :]
  /// summed in j order, in f32 (y, out [R, D] / [N, D] in the activation dtype; rows i32 [N, k]
  /// in [0, R); gates f32 [N, k], undefined = all ones, which makes this the backward of
  /// gather_rows). Gather-based: no atomics, deterministic. @throws std::invalid_argument on
  /// mismatched shapes.
  virtual void moe_combine(const Tensor& y, const Tensor& rows, const Tensor& gates, const Tensor& out) = 0;
  /// Backward of moe_combine with gates: dy[rows[n, j], :] = g[n, j] · dout[n, :] (dy [R, D]
  /// overwritten; every row of dy must appear once in rows) and dgates f32 [N, k] =
  /// Σ_d dout[n, d] · y[rows[n, j], d] (f32 accumulation). @throws std::invalid_argument on
  /// mismatched shapes.
  virtual void moe_combine_backward(const Tensor& dout, const Tensor& y, const Tensor& rows, const Tensor& gates,
                                    const Tensor& dy, const Tensor& dgates) = 0;
  /// Grouped GEMM over row groups (the experts' FFN over tokens sorted by expert; `form` says
  /// which product). a [R, ·], w [G, P, Q], c [R, ·] (kForward, kBackwardInput; overwritten) or
  /// b [R, Q] (kBackwardWeight, w accumulates); R = Σ counts, counts[g] ≥ 0 rows per group on
  /// the host. dtypes as matmul. This default runs one matmul per non-empty group on views;
  /// backends may override it with a grouped kernel of the same arithmetic.
  /// @throws std::invalid_argument on mismatched shapes or counts.
  virtual void grouped_matmul(GroupedGemm form, const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                              const std::vector<int64_t>& counts);
  /// SwiGLU (Shazeer 2020): y = silu(a) ⊙ b; a, b, y [N, H].
  virtual void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  /// da, db [N, H] overwritten.
  virtual void swiglu_backward(const Tensor& dy, const Tensor& a, const Tensor& b, const Tensor& da,
                               const Tensor& db) = 0;
  /// Cross-entropy of logits [N, V] against targets i32 [N]: returns Σ_n (lse_n − logit[n, t_n])
  /// in nats (fp64 sum). When dlogits [N, V] is defined it is overwritten with
  /// grad_scale · (softmax − onehot), fusing the backward so probabilities are never stored.
  /// @throws std::out_of_range for a target outside [0, V).
  virtual double cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                               float grad_scale) = 0;
  /// Vocab-parallel cross-entropy, step 1 (Megatron-LM's vocab-parallel loss, Shoeybi et al.
  /// 2019 §3): per row n of this rank's logits [N, V_local] (vocabulary columns
  /// [vocab_start, vocab_start + V_local)), stats[n] = {m = max_j logit, s = Σ_j exp(logit − m),
  /// the target's logit when this shard holds it, else 0}; stats [N, 3].
  /// @throws std::out_of_range for a target outside [0, vocab_size).
  virtual void cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                     int64_t vocab_size, const Tensor& stats) = 0;
  /// Step 2: combines the stats of P shards, stats_all [P, N, 3] (rank order), into
  /// lse[n] = M + log Σ_p s_p·exp(m_p − M) with M = max_p m_p, and returns
  /// Σ_n (lse[n] − Σ_p target_p[n]) in nats (fp64, fixed order: identical on every rank).
  virtual double cross_entropy_combine(const Tensor& stats_all, const Tensor& lse) = 0;
  /// Step 3: dlogits [N, V_local] = grad_scale · ((1 + 2·z_loss_coeff·lse[n])·exp(logit − lse[n])
  /// − onehot(target)) over this shard's columns; dlogits may alias logits. The z_loss_coeff term
  /// is the gradient of PaLM's auxiliary loss z_loss_coeff · lse² (Chowdhery et al. 2022, §5):
  /// ∂(lse²)/∂logit = 2·lse·softmax. With z_loss_coeff = 0 the factor is exactly 1.
  virtual void cross_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& lse,
                                  const Tensor& dlogits, float grad_scale, float z_loss_coeff) = 0;
  /// Rows per output-head GEMM on this device (model/layers/embedding.cpp, OutputHead): the head
  /// multiplies and accumulates its weight gradient in blocks of this many tokens, anchored at
  /// the first token, so that chunked cross-entropy ([model] loss_chunk_tokens, a multiple of it)
  /// runs exactly the GEMMs of the unchunked path and is bitwise equal to it. 0 = one GEMM per
  /// chunk (devices where bitwise equality is not promised: cuBLAS picks its own split of K).
  virtual int64_t head_gemm_rows() const { return 0; }

  // ---- optimizer and reductions ----
  /// One AdamW step on flat tensors of equal numel (param, grad, exp_avg, exp_avg_sq).
  virtual void adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                     const AdamWParams& p) = 0;
  /// adamw() on every segment (its own weight decay; p.weight_decay is not used), as one
  /// multi-tensor launch per batch of segments on CUDA. Same arithmetic as adamw() per element;
  /// a segment's `compute` copy, when defined, is written in the same pass (CUDA) or by cast()
  /// right after (the default). @throws std::invalid_argument as adamw(), and when a compute copy
  /// is not bf16 of the param's numel.
  virtual void adamw_multi(const std::vector<AdamWSegment>& segments, const AdamWParams& p);
  /// Σ x² in fp64 (for the global gradient norm).
  virtual double sum_squares(const Tensor& x) = 0;
  /// Σ_i sum_squares(xs[i]) / divisors[i] (fp64, in i order): the gradient norm's square over
  /// many tensors with one host synchronization on CUDA. When `each` is given it receives the
  /// terms sum_squares(xs[i]) / divisors[i] one per tensor (0 for an empty one), from the same
  /// pass and synchronization: the non-finite guard names a parameter from them. A NaN or inf
  /// element makes its term and the total non-finite. @throws std::invalid_argument when the
  /// vectors differ in length.
  virtual double sum_squares_multi(const std::vector<Tensor>& xs, const std::vector<double>& divisors,
                                   std::vector<double>* each = nullptr);
  /// x *= alpha.
  virtual void scale(const Tensor& x, float alpha) = 0;
  /// x ← x · float(1 / (‖x‖₂ + eps)), ‖x‖₂ = sqrt(sum_squares(x)) in fp64: the normalization
  /// before Newton–Schulz (optim/newton_schulz.cpp, Muon). The default reads the norm on the
  /// host (sum_squares, then scale); CUDA keeps it on the device, so no synchronization, with the
  /// same bits as its own sum_squares + scale. f32 or bf16 x. @throws std::invalid_argument on
  /// dtype.
  virtual void scale_to_unit_norm(const Tensor& x, double eps);
  /// y += alpha · x (equal numel).
  virtual void add(const Tensor& y, const Tensor& x, float alpha) = 0;
  /// dst = src (equal numel and dtype).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  /// Column block copy between row-major f32 matrices with the same number of rows:
  /// dst[n, dst_col + j] = src[n, src_col + j] for j < cols; dst [N, Cd], src [N, Cs].
  virtual void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols) = 0;
  /// x = value (f32), or zero bytes for other dtypes when value == 0.
  virtual void fill(const Tensor& x, float value) = 0;
  /// dst = src converted between f32 and bf16 (equal numel; bf16 rounds to nearest even, as
  /// torch's .to(torch.bfloat16)); equal dtypes copy. @throws std::invalid_argument for i32.
  virtual void cast(const Tensor& dst, const Tensor& src) = 0;
  /// Float8 training's operand cast (tensor/float8.hpp): dst [R, C] = quantize → dequantize of
  /// src [R, C] (f32, contiguous, row-major) to cast.format with one dynamic scale per
  /// cast.scaling group, rounded down to a power of two when power_of_two (TorchAO's rowwise
  /// recipes); a copy when !cast.quantize. dst may be src. The CPU device emulates it exactly
  /// (float8_cast_operand); this default refuses, so a device without it never trains
  /// silently in high precision (configuration refuses float8 on such devices first).
  /// @throws std::runtime_error "not implemented yet" naming the device; the CPU device throws
  ///         std::invalid_argument for a non-f32 or non-2-D operand or a shape mismatch.
  virtual void float8_cast(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& dst) {
    (void)src, (void)cast, (void)power_of_two, (void)dst;
    throw std::runtime_error("float8 operand casts on the " + name() + " device are not implemented yet");
  }
  /// The two halves of float8_cast for an operand whose scaling groups span ranks (split over
  /// tp): amax [float8_group_count(R, C, scaling)] (f32) of src [R, C] per group, +inf for a group
  /// holding a NaN or ±inf (tensor/float8.hpp, float8_group_amax); then the cast of src into dst
  /// with those groups' amax, reduced over the ranks in between by the caller. Same defaults
  /// and errors as float8_cast.
  virtual void float8_amax(const Tensor& src, Float8Scaling scaling, const Tensor& amax) {
    (void)src, (void)scaling, (void)amax;
    throw std::runtime_error("float8 amax reductions on the " + name() + " device are not implemented yet");
  }
  virtual void float8_cast_with_amax(const Tensor& src, const Float8Cast& cast, bool power_of_two,
                                     const Tensor& amax, const Tensor& dst) {
    (void)src, (void)cast, (void)power_of_two, (void)amax, (void)dst;
    throw std::runtime_error("float8 operand casts on the " + name() + " device are not implemented yet");
  }
  /// The byte form of a tensorwise float8_cast_with_amax, for the FP8 all-gather of FSDP shards
  /// (TorchAO's float8 FSDP all-gather, torchao/float8/fsdp_utils.py, as TorchTitan's
  /// enable_fsdp_float8_all_gather runs it): code i of bytes (the byte at offset i of its
  /// storage, so 4 codes per i32 element, little-endian) := the `format` code of
  /// round_saturate(src_i · s), s = float8_scale(amax[0], format, power_of_two). src: f32 or
  /// bf16, any shape, n = numel elements; amax: f32 [1] (the whole weight's, reduced over the
  /// ranks holding its shards); bytes: i32 with ≥ ⌈n/4⌉ elements (bytes past n are left as
  /// they are). Decoding a code and dividing by s gives float8_cast_with_amax's value, bit for
  /// bit. This default refuses, as float8_cast does.
  /// @throws std::runtime_error "not implemented yet" naming the device; std::invalid_argument
  ///         for wrong dtypes or sizes.
  virtual void float8_quantize_bytes(const Tensor& src, Float8Format format, bool power_of_two, const Tensor& amax,
                                     const Tensor& bytes) {
    (void)src, (void)format, (void)power_of_two, (void)amax, (void)bytes;
    throw std::runtime_error("float8 byte casts on the " + name() + " device are not implemented yet");
  }
  /// The inverse: dst_i := decode(code i of bytes) / s in dst's dtype (f32, or bf16 rounded to
  /// nearest even), s from amax as in float8_quantize_bytes; dst any shape, n = numel. The value
  /// is float8_cast_with_amax's for the same source, amax and recipe. Errors as
  /// float8_quantize_bytes.
  virtual void float8_dequantize_bytes(const Tensor& bytes, Float8Format format, bool power_of_two,
                                       const Tensor& amax, const Tensor& dst) {
    (void)bytes, (void)format, (void)power_of_two, (void)amax, (void)dst;
    throw std::runtime_error("float8 byte casts on the " + name() + " device are not implemented yet");
  }
  /// A Float8 GEMM C[M, N] = alpha · op(A') · op(B') + beta · C, where A' and B' are a and b
  /// after their casts (a.cast, b.cast with power_of_two; a.amax / b.amax as float8_cast_with_amax
  /// when defined) and op, shapes and dtypes as matmul. This default is the emulation (TorchAO's
  /// emulate = true): each operand quantized → dequantized into a temporary in its own dtype, then
  /// matmul — what the CPU device runs whatever `emulate` says (it has no FP8 GEMMs; config refuses
  /// emulate = false there). A device with FP8 GEMMs overrides it for emulate = false (CudaDevice:
  /// cuBLASLt with e4m3 / e5m2 operands, see there). Errors: those of float8_cast and matmul.
  virtual void float8_matmul(const Float8Operand& a, bool trans_a, const Float8Operand& b, bool trans_b,
                             bool power_of_two, bool emulate, const Tensor& c, float alpha, float beta);
};

/// Creates the device named `kind` for this rank: "cpu", or "cuda" (GPU `gpu` of this node,
/// usually the node-local rank modulo the GPU count). `threads` = OpenMP/BLAS threads for the
/// CPU device (0 = OMP_NUM_THREADS or all cores).
/// @throws std::invalid_argument for an unknown kind, or "cuda" in a build without CUDA;
///         std::runtime_error when no usable GPU is present.
std::unique_ptr<Device> make_device(const std::string& kind, int threads = 0, int gpu = 0);

/// Number of CUDA GPUs visible to this process (0 in a build without CUDA or without a
/// driver). Throws nothing.
int cuda_device_count();

/// Whether this meshtrain was compiled with the CUDA backend. Throws nothing.
bool cuda_build();

}  // namespace meshtrain
