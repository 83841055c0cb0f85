#include "model/layers/embedding.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/layers/primitives.hpp"
#include "model/tensor_parallel.hpp"
#include "model/weight_grad_queue.hpp"

namespace meshtrain {

Embedding::Embedding(const ModelArgs& a, const TensorParallel& tp) : vocab_size_(a.vocab_size) {
  // TorchTitan initializes the embedding with N(0, 1); when tied to the output projection the
  // output's init (std D^-1/2) is used instead so initial logits stay O(1).
  const double std = a.tie_word_embeddings ? 1.0 / std::sqrt(double(a.dim)) : 1.0;
  weight = make_parameter("tok_embeddings.weight", {a.vocab_size, a.dim}, InitSpec{InitSpec::Kind::kTruncNormal, std, 3.0}, false);
  split_tensor_parallel(weight, 0, tp.size, tp.rank);
}

Tensor Embedding::forward(StepContext& ctx, SavedTensors&, const Tensor&) {
  const Tensor& w = weight.compute_value();
  Tensor out = ctx.dev->empty({ctx.tokens.numel(), w.dim(1)}, ctx.act_dtype, MemCategory::kActivations);
  ctx.dev->embedding_forward(w, ctx.tokens, out, weight.sharding.tp_first, vocab_size_);
  return tp_exit(*ctx.dev, ctx.tp, out);
}

Tensor Embedding::backward(StepContext& ctx, SavedTensors&, const Tensor& dout) {
  // The all-gather (a collective every tp rank joins in order) stays here; only the
  // scatter-add into the weight gradient may be deferred.
  const Tensor grad_out = tp_enter(*ctx.dev, ctx.tp, dout);
  if (ctx.defer_weight_grads)
    ctx.defer_weight_grads->embedding(grad_out, ctx.tokens, weight, weight.sharding.tp_first);
  else
    ctx.dev->embedding_backward(grad_out, ctx.tokens, weight.grad, weight.sharding.tp_first);
  return Tensor();
}

OutputHead::OutputHead(const ModelArgs& a, Parameter* tied_embedding, const TensorParallel& tp)
    : tied_(a.tie_word_embeddings ? tied_embedding : nullptr),
      eps_(float(a.norm_eps)),
      vocab_size_(a.vocab_size),
      z_coeff_(float(a.output_z_loss_coeff)),
      chunk_tokens_(a.loss_chunk_tokens) {
  norm = make_parameter("norm.weight", {a.dim}, InitSpec{InitSpec::Kind::kOnes, 0, 0}, false);
  norm.sharding.tp_partial_grad = tp.active() && tp.sequence_parallel;
  const InitSpec init{InitSpec::Kind::kTruncNormal, 1.0 / std::sqrt(double(a.dim)), 3.0};
  if (a.tie_word_embeddings && !tied_) {
    // A pipeline stage without the embedding: its own copy of the shared weight, with the
    // embedding's name, init and (no) weight decay, so it starts equal and stays equal.
    output = make_parameter("tok_embeddings.weight", {a.vocab_size, a.dim}, init, false);
    output.sharding.tied_copy = true;
    split_tensor_parallel(output, 0, tp.size, tp.rank);
  } else if (!tied_) {
    output = make_parameter("output.weight", {a.vocab_size, a.dim}, init);
    split_tensor_parallel(output, 0, tp.size, tp.rank);
  }
}

std::vector<Parameter*> OutputHead::parameters() {
  if (tied_) return {&norm};
  return {&norm, &output};
}

namespace {
// Rows [r0, r0 + rows) of a row-major matrix m [N, C], as a view.
Tensor row_block(const Tensor& m, int64_t r0, int64_t rows) { return m.view({rows, m.dim(1)}, r0 * m.dim(1)); }
}  // namespace

int64_t OutputHead::chunk_rows(const Device& dev, int64_t n) const {
  const int64_t block = dev.head_gemm_rows();
  if (chunk_tokens_ < 0 || (chunk_tokens_ > 0 && block > 0 && chunk_tokens_ % block))
    throw std::invalid_argument("[model] loss_chunk_tokens: " + std::to_string(chunk_tokens_) +
                                " is not a multiple of the head's GEMM block " + std::to_string(block));
  return chunk_tokens_ > 0 ? std::min(chunk_tokens_, n) : n;
}

Tensor OutputHead::chunk_logits(Device& dev, const Tensor& h, const Tensor& w, int64_t r0, int64_t c) const {
  Tensor logits = dev.empty({c, w.dim(0)}, h.dtype(), MemCategory::kActivations);
  const int64_t block = dev.head_gemm_rows() > 0 ? dev.head_gemm_rows() : c;
  for (int64_t b = 0; b < c; b += block) {
    const int64_t rows = std::min(block, c - b);
    dev.matmul(row_block(h, r0 + b, rows), false, w, true, row_block(logits, b, rows), 1.0f, 0.0f);
  }
  return logits;
}

void OutputHead::chunk_backward(const StepContext& ctx, const Tensor& dlogits, const Tensor& h, int64_t r0,
                                const Tensor& dh, bool may_defer) {
  Device& dev = *ctx.dev;
  Parameter& w = out_weight();
  const Tensor& wc = w.compute_value();
  const int64_t c = dlogits.dim(0), block = dev.head_gemm_rows() > 0 ? dev.head_gemm_rows() : c;
  // The weight gradient sums over tokens: blocks in token order, whatever the chunking, so the
  // sum's rounding is the unchunked head's.
  for (int64_t b = 0; b < c; b += block) {
    const int64_t rows = std::min(block, c - b);
    const Tensor dy = row_block(dlogits, b, rows), x = row_block(h, r0 + b, rows);
    if (may_defer && ctx.defer_weight_grads)
      ctx.defer_weight_grads->linear(dy, x, w);
    else
      dev.matmul(dy, true, x, false, w.grad, 1.0f, 1.0f);
    dev.matmul(dy, false, wc, false, row_block(dh, r0 + b, rows), 1.0f, 0.0f);
  }
}

Tensor OutputHead::forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) {
  Device& dev = *ctx.dev;
  Tensor h = tp_enter(dev, ctx.tp, rmsnorm_forward(dev, saved, x, norm, eps_));
  Parameter& w = out_weight();
  const Tensor& wc = w.compute_value();
  const int64_t n = h.dim(0), chunk = chunk_rows(dev, n), first = w.sharding.tp_first;
  const bool chunked = chunk < n;
  // Per-token statistics of every chunk; the loss is one fixed-order sum over all n rows.
  Tensor stats = dev.empty({tp_loss_shards(ctx.tp), n, 3}, DType::kF32, MemCategory::kTemporaries);
  Tensor lse = dev.empty({n}, DType::kF32,
                         chunked && ctx.need_backward ? MemCategory::kActivations : MemCategory::kTemporaries);
  Tensor dlogits;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t c = std::min(chunk, n - r0);
    const Tensor logits = chunk_logits(dev, h, wc, r0, c), targets = ctx.targets.view({c}, r0), lse_c = lse.view({c}, r0);
    tp_cross_entropy_stats(dev, ctx.tp, logits, targets, first, vocab_size_, stats, r0, lse_c);
    if (ctx.need_backward && !chunked) {
      // Unchunked: the gradient overwrites the logits in place, one [N, V_local] buffer kept.
      dev.cross_entropy_grad(logits, targets, first, lse_c, logits, ctx.loss_grad_scale, z_coeff_);
      dlogits = logits;
    }
  }
  ctx.loss_sum += dev.cross_entropy_combine(stats, lse);
  ctx.num_targets += ctx.targets.numel();
  if (z_coeff_ != 0) z_loss_sum_ += double(z_coeff_) * dev.sum_squares(lse);
  saved.push(h);
  if (chunked) {  // backward recomputes the logits chunk by chunk from h, the targets and lse
    saved.push(ctx.targets);
    saved.push(lse);
  } else {
    saved.push(dlogits);
  }
  return Tensor();
}

Tensor OutputHead::backward(StepContext& ctx, SavedTensors& saved, const Tensor&) {
  Device& dev = *ctx.dev;
  Tensor kept = saved.pop();  // dlogits [N, V_local] (unchunked) or lse [N] (chunked)
  const bool chunked = kept.ndim() == 1;
  Tensor targets = chunked ? saved.pop() : Tensor();
  Tensor h = saved.pop();
  Parameter& w = out_weight();
  const Tensor& wc = w.compute_value();
  const int64_t n = h.dim(0), first = w.sharding.tp_first;
  Tensor dh = dev.empty({n, h.dim(1)}, h.dtype(), MemCategory::kActivations);
  if (!chunked) {
    chunk_backward(ctx, kept, h, 0, dh, true);  // kept: the logits buffer the loss overwrote with its gradient
  } else {
    const int64_t chunk = chunk_rows(dev, n);
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t c = std::min(chunk, n - r0);
      Tensor dlogits = chunk_logits(dev, h, wc, r0, c);
      dev.cross_entropy_grad(dlogits, targets.view({c}, r0), first, kept.view({c}, r0), dlogits, ctx.loss_grad_scale,
                             z_coeff_);
      chunk_backward(ctx, dlogits, h, r0, dh, false);
    }
  }
  return rmsnorm_backward(ctx, saved, tp_exit(dev, ctx.tp, dh), norm);
}

}  // namespace meshtrain
