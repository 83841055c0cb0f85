#include "model/layers/attention.hpp"

#include <cmath>
#include <stdexcept>

#include "model/async_tensor_parallel.hpp"
#include "model/layers/primitives.hpp"
#include "parallel/context/cp_attention.hpp"

namespace meshtrain {

std::vector<int32_t> document_starts(const int32_t* samples, int64_t n, int64_t t, int32_t eos_id) {
  std::vector<int32_t> starts(size_t(n * t));
  for (int64_t b = 0; b < n; ++b) {
    const int32_t* in = samples + b * (t + 1);
    int32_t* s = starts.data() + b * t;
    for (int64_t p = 0; p < t; ++p) s[p] = (p == 0 || in[p - 1] == eos_id) ? int32_t(p) : s[p - 1];
  }
  return starts;
}

namespace {

// The micro-batch's document mask (none unless attn_mask_type = "block_causal").
DocumentMask documents(const StepContext& ctx) {
  DocumentMask m{ctx.doc_start};
  if (ctx.doc_start.defined()) m.host_starts = ctx.doc_start_host.data();
  return m;
}

}  // namespace

Attention::Attention(const ModelArgs& a, int layer_id, const std::string& prefix, const TensorParallel& tp)
    : name_(prefix + "attention"),
      n_heads_(a.n_heads / tp.size),
      n_kv_heads_(a.n_kv_heads / tp.size),
      head_dim_(a.head_dim),
      qk_norm_(a.qk_norm),
      norm_eps_(float(a.norm_eps)) {
  // TorchTitan's depth-scaled init: output projections use std 0.02 / sqrt(2·(layer_id + 1)).
  const InitSpec base{InitSpec::Kind::kTruncNormal, 0.02, 2.0};
  const InitSpec depth{InitSpec::Kind::kTruncNormal, 0.02 / std::sqrt(2.0 * (layer_id + 1)), 2.0};
  const InitSpec ones{InitSpec::Kind::kOnes, 0, 0};
  wq = make_parameter(name_ + ".wq.weight", {a.n_heads * a.head_dim, a.dim}, base);
  wk = make_parameter(name_ + ".wk.weight", {a.n_kv_heads * a.head_dim, a.dim}, base);
  wv = make_parameter(name_ + ".wv.weight", {a.n_kv_heads * a.head_dim, a.dim}, base);
  wo = make_parameter(name_ + ".wo.weight", {a.dim, a.n_heads * a.head_dim}, depth);
  if (a.n_heads % tp.size || a.n_kv_heads % tp.size)
    throw std::invalid_argument(name_ + ": n_heads and n_kv_heads must divide by tp " + std::to_string(tp.size));
  for (Parameter* w : {&wq, &wk, &wv}) split_tensor_parallel(*w, 0, tp.size, tp.rank);
  split_tensor_parallel(wo, 1, tp.size, tp.rank);
  if (qk_norm_) {
    q_norm = make_parameter(name_ + ".q_norm.weight", {a.head_dim}, ones, false);
    k_norm = make_parameter(name_ + ".k_norm.weight", {a.head_dim}, ones, false);
    // Each tp rank normalizes only its own heads, so it holds part of the gradient.
    for (Parameter* w : {&q_norm, &k_norm}) w->sharding.tp_partial_grad = tp.active();
  }
}

std::vector<Parameter*> Attention::parameters() {
  std::vector<Parameter*> out{&wq, &wk, &wv, &wo};
  if (qk_norm_) {
    out.push_back(&q_norm);
    out.push_back(&k_norm);
  }
  return out;
}

Tensor Attention::project_qk(StepContext& ctx, SavedTensors& saved, const std::function<Tensor()>& linear,
                             Parameter& norm, int64_t heads) {
  Device& dev = *ctx.dev;
  // RoPE rotates y in place (without q/k norm): a kept y is stashed as a copy.
  Tensor y = saved.op(SacOp::kMatmul, dev, linear, true);
  if (qk_norm_) y = rmsnorm_forward(dev, saved, y.reshape({y.numel() / head_dim_, head_dim_}), norm, norm_eps_);
  Tensor y4 = y.reshape({int64_t(ctx.shard.chunks.size()) * ctx.batch, ctx.shard.chunk_len, heads, head_dim_});
  rope_chunks(ctx, y4, false);
  return y4;
}

void Attention::rope_chunks(StepContext& ctx, const Tensor& x, bool inverse) const {
  const SequenceShard& s = ctx.shard;
  const int64_t c = s.chunk_len, half = head_dim_ / 2, heads = x.dim(2), per = ctx.batch * c * heads * head_dim_;
  for (size_t k = 0; k < s.chunks.size(); ++k)
    ctx.dev->rope(x.view({ctx.batch, c, heads, head_dim_}, int64_t(k) * per),
                  ctx.rope_cos.view({c, half}, s.chunks[k] * c * half),
                  ctx.rope_sin.view({c, half}, s.chunks[k] * c * half), inverse);
}

Tensor Attention::forward(StepContext& ctx, SavedTensors& saved, const Tensor& x_local) {
  Device& dev = *ctx.dev;
  if (ctx.shard.local_len() != ctx.seq_len)
    throw std::logic_error(name_ + ": the step context's sequence shard holds " +
                           std::to_string(ctx.shard.local_len()) + " tokens per sample, not seq_len " +
                           std::to_string(ctx.seq_len) + " (build it with Transformer::make_context)");
  // Under async TP the three projections come out of the fused all-gather; per-operator
  // checkpointing still sees each as its own matmul (a replay reads the kept ones from its stash).
  const AllGatherMatmul entry = tp_region_enter(ctx, x_local, {&wq, &wk, &wv});
  const Tensor& x = entry.gathered;
  auto linear = [&](size_t i, const Parameter& w) {
    return [&, i, wp = &w] { return entry.outs.empty() ? linear_forward(dev, x, *wp) : entry.outs[i]; };
  };
  const int64_t n = x.dim(0);
  Tensor q = project_qk(ctx, saved, linear(0, wq), q_norm, n_heads_);
  Tensor k = project_qk(ctx, saved, linear(1, wk), k_norm, n_kv_heads_);
  Tensor v = saved.op(SacOp::kMatmul, dev, linear(2, wv), false).reshape(k.shape());
  const float scale = 1.0f / std::sqrt(float(head_dim_));
  Tensor o;
  if (ctx.cp.active()) {  // the sequence is split over cp: attention crosses the group
    // Per-op checkpointing keeps the exchange's whole state (its output and what its backward reads).
    const std::vector<Tensor> f = saved.op_multi(SacOp::kAttention, dev, [&] {
      CpAttentionForward r = cp_attention_forward(dev, ctx.cp, ctx.shard, ctx.batch, q, k, v, scale, documents(ctx));
      std::vector<Tensor> out{r.out};
      out.insert(out.end(), r.saved.begin(), r.saved.end());
      return out;
    }, false);
    o = f.front();
    saved.push(x);
    for (size_t i = 1; i < f.size(); ++i) saved.push(f[i]);
  } else {
    const std::vector<Tensor> ol = saved.op_multi(SacOp::kAttention, dev, [&] {
      Tensor out = dev.empty(q.shape(), q.dtype(), MemCategory::kActivations);
      Tensor lse = dev.empty({ctx.batch, n_heads_, ctx.seq_len}, DType::kF32, MemCategory::kActivations);
      dev.attention_forward(q, k, v, out, lse, scale, documents(ctx));
      return std::vector<Tensor>{out, lse};
    }, false);
    o = ol[0];
    for (const Tensor& t : {x, q, k, v, ol[1]}) saved.push(t);
  }
  saved.push(o);
  return tp_region_exit(ctx, saved, o.reshape({n, n_heads_ * head_dim_}), wo);
}

Tensor Attention::project_qk_backward(StepContext& ctx, SavedTensors& saved, Tensor dq, Parameter& norm,
                                      int64_t heads) {
  rope_chunks(ctx, dq, true);  // RoPE is orthogonal: its adjoint is the inverse rotation
  Tensor d2 = dq.reshape({dq.numel() / head_dim_, head_dim_});
  // d2 is dq after the in-place inverse rotation: what the norm's (possibly deferred) dW reads.
  if (qk_norm_) d2 = rmsnorm_backward(ctx, saved, d2, norm);
  return d2.reshape({ctx.batch * ctx.seq_len, heads * head_dim_});
}

Tensor Attention::backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout_local) {
  Device& dev = *ctx.dev;
  const Tensor o = saved.pop();
  const int64_t n = o.numel() / (n_heads_ * head_dim_);
  Tensor d_o = tp_region_exit_backward(ctx, dout_local, o.reshape({n, n_heads_ * head_dim_}), wo).reshape(o.shape());
  const float scale = 1.0f / std::sqrt(float(head_dim_));
  Tensor dq, dk, dv, x;
  if (ctx.cp.active()) {
    std::vector<Tensor> kept(5);
    for (size_t i = kept.size(); i-- > 0;) kept[i] = saved.pop();
    x = saved.pop();
    CpAttentionGrads g = cp_attention_backward(dev, ctx.cp, ctx.shard, ctx.batch, kept, d_o, scale, documents(ctx));
    dq = g.dq, dk = g.dk, dv = g.dv;
  } else {
    Tensor lse = saved.pop(), v = saved.pop(), k = saved.pop(), q = saved.pop();
    x = saved.pop();
    dq = dev.empty(q.shape(), q.dtype(), MemCategory::kActivations);
    dk = dev.empty(k.shape(), k.dtype(), MemCategory::kActivations);
    dv = dev.empty(v.shape(), v.dtype(), MemCategory::kActivations);
    dev.attention_backward(d_o, q, k, v, o, lse, scale, dq, dk, dv, documents(ctx));
  }
  // Pops mirror project_qk's pushes: k's norm state was pushed after q's.
  Tensor dk2 = project_qk_backward(ctx, saved, dk, k_norm, n_kv_heads_);
  Tensor dq2 = project_qk_backward(ctx, saved, dq, q_norm, n_heads_);
  return tp_region_enter_backward(ctx, {dq2, dk2, dv.reshape({n, n_kv_heads_ * head_dim_})}, x, {&wq, &wk, &wv});
}

}  // namespace meshtrain
