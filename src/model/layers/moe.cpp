#include "model/layers/moe.hpp"

#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "model/layers/moe_dispatch.hpp"
#include "model/layers/moe_exchange.hpp"
#include "model/layers/primitives.hpp"
#include "model/weight_grad_queue.hpp"

namespace meshtrain {

namespace {

Tensor upload_i32(Device& dev, const std::vector<int32_t>& v, const Shape& shape) {
  Tensor t = dev.empty(shape, DType::kI32, MemCategory::kActivations);
  dev.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

// w.grad += per-expert dyᵀ·x, or that term deferred (split backward).
void grouped_weight_grad(const StepContext& ctx, const Tensor& dy, const Tensor& x, const std::vector<int64_t>& counts,
                         const Parameter& w) {
  if (ctx.defer_weight_grads)
    ctx.defer_weight_grads->grouped_linear(dy, x, counts, w);
  else
    ctx.dev->grouped_matmul(GroupedGemm::kBackwardWeight, dy, x, w.grad, Tensor(), counts);
}

MoeScoreFunc score_func(const std::string& s) {
  if (s == "softmax") return MoeScoreFunc::kSoftmax;
  if (s == "sigmoid") return MoeScoreFunc::kSigmoid;
  throw std::invalid_argument("MoE: score_func '" + s + "' (softmax | sigmoid)");
}

}  // namespace

MoE::MoE(const ModelArgs& a, int layer_id, const std::string& prefix, const TensorParallel& tp,
         const ExpertParallel& ep)
    : name_(prefix + "moe"),
      layer_id_(layer_id),
      e_(a.num_experts),
      k_(a.top_k),
      dim_(a.dim),
      hidden_(a.moe_inter_dim),
      aux_coeff_(a.aux_loss_coeff),
      z_coeff_(a.z_loss_coeff),
      partial_over_tp_(tp.active() && tp.sequence_parallel) {
  if (e_ < 1 || k_ < 1 || k_ > e_ || hidden_ < 1)
    throw std::invalid_argument("MoE: num_experts " + std::to_string(e_) + ", top_k " + std::to_string(k_) +
                                ", moe_inter_dim " + std::to_string(hidden_) +
                                " (need num_experts >= 1, 1 <= top_k <= num_experts, moe_inter_dim >= 1)");
  routing_.score_func = score_func(a.score_func);
  routing_.top_k = k_;
  routing_.route_norm = a.route_norm;
  routing_.route_scale = float(a.route_scale);
  // As the dense FFN: the input projections at the base std, the output projections scaled
  // with depth (TorchTitan's Llama init, layer_id-dependent); the router like an output.
  const InitSpec base{InitSpec::Kind::kTruncNormal, 0.02, 2.0};
  const InitSpec depth{InitSpec::Kind::kTruncNormal, 0.02 / std::sqrt(2.0 * (layer_id + 1)), 2.0};
  gate = make_parameter(name_ + ".router.gate.weight", {e_, dim_}, depth);
  w1 = make_parameter(name_ + ".experts.w1", {e_, hidden_, dim_}, base);
  w2 = make_parameter(name_ + ".experts.w2", {e_, dim_, hidden_}, depth);
  w3 = make_parameter(name_ + ".experts.w3", {e_, hidden_, dim_}, depth);
  for (Parameter* p : {&gate, &w1, &w2, &w3}) p->sharding.tp_partial_grad = partial_over_tp_;
  for (Parameter* p : {&w1, &w2, &w3}) split_expert_parallel(*p, ep.size, ep.rank);
  ep_size_ = ep.size;
  if (a.num_shared_experts > 0)
    shared_ = std::make_unique<FeedForward>(a, layer_id, name_ + ".shared_experts", a.num_shared_experts * hidden_, tp);
  bias_.assign(size_t(e_), 0.0f);
  stats_.tokens_per_expert.assign(size_t(e_), 0.0);
}

std::vector<Parameter*> MoE::parameters() {
  std::vector<Parameter*> out{&gate, &w1, &w2, &w3};
  if (shared_)
    for (Parameter* p : shared_->parameters()) out.push_back(p);
  return out;
}

void MoE::set_expert_bias(std::vector<float> bias) {
  if (int64_t(bias.size()) != e_)
    throw std::invalid_argument(name_ + ".expert_bias: " + std::to_string(bias.size()) + " values for " +
                                std::to_string(e_) + " experts");
  bias_ = std::move(bias);
  bias_stale_ = true;
}

void MoE::clear_step_stats() {
  stats_.tokens_per_expert.assign(size_t(e_), 0.0);
  stats_.aux_loss = stats_.z_loss = stats_.dispatch_s = 0;
}

Tensor MoE::forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) {
  Device& dev = *ctx.dev;
  const int64_t n = x.dim(0), r = n * k_;
  const bool count = ctx.need_backward && !saved.discard();
  // Tokens another tp rank also computes (no sequence parallelism) are counted on tp rank 0 only.
  const double weight = partial_over_tp_ || ctx.tp.rank == 0 ? 1.0 : 0.0;

  // 1. Router, in f32 whatever the activation dtype.
  Tensor logits = dev.empty({n, e_}, DType::kF32, MemCategory::kActivations);
  linear_forward_into(dev, x, gate, logits);
  if (bias_stale_) {
    if (!bias_dev_.defined()) bias_dev_ = dev.empty({e_}, DType::kF32, MemCategory::kParameters);
    dev.upload(bias_dev_, bias_.data(), bias_.size() * sizeof(float));
    bias_stale_ = false;
  }
  Tensor scores = dev.empty({n, e_}, DType::kF32, MemCategory::kActivations);
  Tensor topk = dev.empty({n, k_}, DType::kI32, MemCategory::kActivations);
  Tensor gates = dev.empty({n, k_}, DType::kF32, MemCategory::kActivations);
  const bool balance_loss = aux_coeff_ > 0 && ctx.need_backward;
  TokenPlaces places;
  if (ctx.moe_force_load_balance || balance_loss)
    places = token_places(ctx.shard, ctx.batch, partial_over_tp_ ? ctx.tp.rank * n : 0, n);
  std::vector<int32_t> host_topk(static_cast<size_t>(r));
  if (ctx.moe_force_load_balance) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k_; ++j) host_topk[size_t(t * k_ + j)] = int32_t((places.position[size_t(t)] * k_ + j) % e_);
    dev.upload(topk, host_topk.data(), host_topk.size() * sizeof(int32_t));
  }
  dev.moe_router_forward(logits, bias_dev_, routing_, !ctx.moe_force_load_balance, scores, topk, gates);
  if (!ctx.moe_force_load_balance) dev.download(host_topk.data(), topk, host_topk.size() * sizeof(int32_t));

  // 2. Dispatch into expert order (and, with ep, to the experts' ranks); 3. the experts;
  // 4. back and combine.
  const MoeDispatchPlan plan = plan_dispatch(host_topk.data(), n, k_, e_);
  Tensor rows = upload_i32(dev, plan.rows, {n, k_});
  Tensor src = upload_i32(dev, plan.src, {r});
  Tensor xs = dev.empty({r, dim_}, x.dtype(), MemCategory::kActivations);
  dev.gather_rows(x, src, xs);
  ExchangeState ex;
  // Per-op checkpointing keeps the all-to-alls' outputs (the router and experts are recomputed).
  const auto exchanged = [&](const Tensor& rows_in, bool to_experts) {
    return saved.op(SacOp::kCollective, dev, [&] { return exchange_rows(ctx, ex, rows_in, to_experts); }, false);
  };
  if (ep_size_ > 1) ex = start_exchange(ctx, saved, plan.counts);
  Tensor xe = ep_size_ > 1 ? exchanged(xs, true) : xs;
  const std::vector<int64_t>& counts = ep_size_ > 1 ? ex.plan.local_counts : plan.counts;
  const int64_t re = xe.dim(0);
  Tensor a = dev.empty({re, hidden_}, x.dtype(), MemCategory::kActivations);
  Tensor b = dev.empty({re, hidden_}, x.dtype(), MemCategory::kActivations);
  Tensor h = dev.empty({re, hidden_}, x.dtype(), MemCategory::kActivations);
  Tensor ye = dev.empty({re, dim_}, x.dtype(), MemCategory::kActivations);
  dev.grouped_matmul(GroupedGemm::kForward, xe, Tensor(), w1.compute_value(), a, counts);
  dev.grouped_matmul(GroupedGemm::kForward, xe, Tensor(), w3.compute_value(), b, counts);
  dev.swiglu_forward(a, b, h);
  dev.grouped_matmul(GroupedGemm::kForward, h, Tensor(), w2.compute_value(), ye, counts);
  Tensor y = ep_size_ > 1 ? exchanged(ye, false) : ye;
  Tensor out = dev.empty({n, dim_}, x.dtype(), MemCategory::kActivations);
  dev.moe_combine(y, rows, gates, out);

  if (count) {
    for (int64_t x_e = 0; x_e < e_; ++x_e) stats_.tokens_per_expert[size_t(x_e)] += weight * double(plan.counts[size_t(x_e)]);
    if (z_coeff_ > 0) stats_.z_loss += weight * z_coeff_ * ctx.loss_grad_scale * dev.moe_z_loss(logits, 0.0f, Tensor());
  }
  for (const Tensor& t : {x, logits, scores, topk, gates, rows, xe, a, b, h, y}) saved.push(t);
  if (ep_size_ > 1)
    for (const Tensor& t : {ex.recv_counts, ex.perm, ex.inv_perm}) saved.push(t);

  if (balance_loss) {
    // Per-sequence statistics [S, E]: Σ s' and the (token, choice) counts, summed over the
    // ranks holding parts of each sequence (cp; tp under sequence parallelism).
    const int64_t s = ctx.batch, t_len = ctx.shard.seq_len;
    Tensor sample = upload_i32(dev, places.sample, {n});
    Tensor sums = dev.empty({s, e_}, DType::kF32, MemCategory::kActivations);
    dev.moe_aux_stats(scores, sample, routing_.score_func, sums);
    std::vector<float> host_sums(size_t(s * e_));
    dev.download(host_sums.data(), sums, host_sums.size() * sizeof(float));
    std::vector<double> st(size_t(2 * s * e_), 0.0);
    for (size_t i = 0; i < host_sums.size(); ++i) st[i] = host_sums[i];
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k_; ++j) st[size_t(s * e_ + places.sample[size_t(t)] * e_ + host_topk[size_t(t * k_ + j)])] += 1;
    if (ctx.cp.size > 1) ctx.cp.comm->all_reduce_host(st.data(), int(st.size()), ReduceOp::kSum);
    if (partial_over_tp_) ctx.tp.comm->all_reduce_host(st.data(), int(st.size()), ReduceOp::kSum);
    // loss_grad_scale · T = 1 / (sequences in the global batch): every token is a target.
    const double per_seq = aux_coeff_ * double(ctx.loss_grad_scale) * double(t_len);
    const double f_scale = double(e_) / double(k_ * t_len);
    std::vector<float> coef(size_t(s * e_));
    double loss = 0;
    for (int64_t i = 0; i < s * e_; ++i) {
      const double f = f_scale * st[size_t(s * e_ + i)];
      loss += per_seq * f * st[size_t(i)] / double(t_len);
      coef[size_t(i)] = float(per_seq * f / double(t_len));
    }
    if (count && ctx.cp.rank == 0 && ctx.tp.rank == 0) stats_.aux_loss += loss;
    Tensor coef_dev = dev.empty({s, e_}, DType::kF32, MemCategory::kActivations);
    dev.upload(coef_dev, coef.data(), coef.size() * sizeof(float));
    saved.push(sample);
    saved.push(coef_dev);
  }

  if (shared_) dev.add(out, shared_->forward(ctx, saved, x), 1.0f);
  return out;
}

Tensor MoE::backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) {
  Device& dev = *ctx.dev;
  Tensor dx_shared = shared_ ? shared_->backward(ctx, saved, dout) : Tensor();
  Tensor coef, sample;
  if (aux_coeff_ > 0) coef = saved.pop(), sample = saved.pop();
  ExchangeState ex;
  if (ep_size_ > 1) ex.inv_perm = saved.pop(), ex.perm = saved.pop(), ex.recv_counts = saved.pop();
  Tensor y = saved.pop(), h = saved.pop(), b = saved.pop(), a = saved.pop(), xe = saved.pop();
  Tensor rows = saved.pop(), gates = saved.pop(), topk = saved.pop(), scores = saved.pop(), logits = saved.pop();
  Tensor x = saved.pop();
  const int64_t n = x.dim(0), r = n * k_, re = xe.dim(0);
  std::vector<int32_t> host_topk(static_cast<size_t>(r));
  dev.download(host_topk.data(), topk, host_topk.size() * sizeof(int32_t));
  std::vector<int64_t> counts = plan_dispatch(host_topk.data(), n, k_, e_).counts;
  if (ep_size_ > 1) {  // the forward's exchange, from the saved counts
    std::vector<int32_t> recv(static_cast<size_t>(e_));
    dev.download(recv.data(), ex.recv_counts, recv.size() * sizeof(int32_t));
    ex.plan = make_ep_exchange(counts, recv, ep_size_);
    counts = ex.plan.local_counts;
  }

  // Combine and experts, in reverse (the gradients travel the forward's exchange paths).
  Tensor dy = dev.empty({r, dim_}, dout.dtype(), MemCategory::kActivations);
  Tensor dgates = dev.empty({n, k_}, DType::kF32, MemCategory::kActivations);
  dev.moe_combine_backward(dout, y, rows, gates, dy, dgates);
  Tensor dye = ep_size_ > 1 ? exchange_rows(ctx, ex, dy, true) : dy;
  Tensor dh = dev.empty({re, hidden_}, dout.dtype(), MemCategory::kActivations);
  dev.grouped_matmul(GroupedGemm::kBackwardInput, dye, Tensor(), w2.compute_value(), dh, counts);
  grouped_weight_grad(ctx, dye, h, counts, w2);
  Tensor da = dev.empty({re, hidden_}, dout.dtype(), MemCategory::kActivations);
  Tensor db = dev.empty({re, hidden_}, dout.dtype(), MemCategory::kActivations);
  dev.swiglu_backward(dh, a, b, da, db);
  Tensor dxe = dev.empty({re, dim_}, dout.dtype(), MemCategory::kActivations);
  Tensor dxe3 = dev.empty({re, dim_}, dout.dtype(), MemCategory::kActivations);
  dev.grouped_matmul(GroupedGemm::kBackwardInput, da, Tensor(), w1.compute_value(), dxe, counts);
  dev.grouped_matmul(GroupedGemm::kBackwardInput, db, Tensor(), w3.compute_value(), dxe3, counts);
  dev.add(dxe, dxe3, 1.0f);
  grouped_weight_grad(ctx, da, xe, counts, w1);
  grouped_weight_grad(ctx, db, xe, counts, w3);
  Tensor dxs = ep_size_ > 1 ? exchange_rows(ctx, ex, dxe, false) : dxe;
  // The dispatch's backward: each token sums the gradients of its k rows.
  Tensor dx = dev.empty({n, dim_}, dout.dtype(), MemCategory::kActivations);
  dev.moe_combine(dxs, rows, Tensor(), dx);

  // Router: gates, balance loss and z-loss into the logits, then the gate projection.
  Tensor dscores_extra;
  if (coef.defined()) {
    dscores_extra = dev.empty({n, e_}, DType::kF32, MemCategory::kActivations);
    dev.moe_aux_backward(coef, sample, scores, routing_.score_func, dscores_extra);
  }
  Tensor dlogits = dev.empty({n, e_}, DType::kF32, MemCategory::kActivations);
  dev.moe_router_backward(dgates, scores, topk, routing_, dscores_extra, dlogits);
  if (z_coeff_ > 0) dev.moe_z_loss(logits, float(z_coeff_ * ctx.loss_grad_scale), dlogits);
  Tensor dlogits_act = dlogits;
  if (dout.dtype() != DType::kF32) {  // the gate's matmuls read activation-dtype operands
    dlogits_act = dev.empty({n, e_}, dout.dtype(), MemCategory::kActivations);
    dev.cast(dlogits_act, dlogits);
  }
  linear_backward(ctx, dlogits_act, x, gate, &dx);
  if (dx_shared.defined()) dev.add(dx, dx_shared, 1.0f);
  return dx;
}

namespace {
// Adds the wall time of its scope to `total` (seconds): the exchange's share of a step.
struct ScopeTimer {
  double& total;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~ScopeTimer() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};
}  // namespace

MoE::ExchangeState MoE::start_exchange(StepContext& ctx, SavedTensors& saved, const std::vector<int64_t>& counts) {
  ScopeTimer timer{stats_.dispatch_s};
  Device& dev = *ctx.dev;
  if (ctx.ep.size != ep_size_ || !ctx.ep.comm)
    throw std::logic_error(name_ + ": built for ep " + std::to_string(ep_size_) + ", the step has ep " +
                           std::to_string(ctx.ep.size));
  // Every rank's counts for every expert, exchanged so that each rank learns what it receives.
  std::vector<int32_t> mine(counts.begin(), counts.end());
  Tensor send = upload_i32(dev, mine, {e_});
  ExchangeState ex;
  ex.recv_counts = saved.op(SacOp::kCollective, dev, [&] {
    Tensor recv = dev.empty({e_}, DType::kI32, MemCategory::kActivations);
    ctx.ep.comm->all_to_all(send, recv)->wait();
    return recv;
  }, false);
  std::vector<int32_t> recv(static_cast<size_t>(e_));
  dev.download(recv.data(), ex.recv_counts, recv.size() * sizeof(int32_t));
  ex.plan = make_ep_exchange(counts, recv, ep_size_);
  ex.perm = upload_i32(dev, ex.plan.perm, {ex.plan.rows_in});
  ex.inv_perm = upload_i32(dev, ex.plan.inv_perm, {ex.plan.rows_in});
  return ex;
}

Tensor MoE::exchange_rows(StepContext& ctx, const ExchangeState& ex, const Tensor& rows, bool to_experts) {
  ScopeTimer timer{stats_.dispatch_s};
  Device& dev = *ctx.dev;
  const EpExchange& p = ex.plan;
  if (to_experts) {  // this rank's expert-sorted rows → the experts' ranks, then (expert, source) order
    Tensor arrived = dev.empty({p.rows_in, dim_}, rows.dtype(), MemCategory::kCommunication);
    ctx.ep.comm->all_to_all_v(rows, p.send_rows, arrived, p.recv_rows)->wait();
    Tensor out = dev.empty({p.rows_in, dim_}, rows.dtype(), MemCategory::kActivations);
    if (p.rows_in) dev.gather_rows(arrived, ex.perm, out);
    return out;
  }
  Tensor back = dev.empty({p.rows_in, dim_}, rows.dtype(), MemCategory::kCommunication);  // (source, expert) order
  if (p.rows_in) dev.gather_rows(rows, ex.inv_perm, back);
  int64_t r = 0;
  for (int64_t v : p.send_rows) r += v;
  Tensor out = dev.empty({r, dim_}, rows.dtype(), MemCategory::kActivations);
  ctx.ep.comm->all_to_all_v(back, p.recv_rows, out, p.send_rows)->wait();
  return out;
}

std::vector<float> update_expert_bias(const std::vector<float>& bias, const std::vector<double>& load, double coeff) {
  if (bias.size() != load.size())
    throw std::invalid_argument("update_expert_bias: " + std::to_string(bias.size()) + " biases for " +
                                std::to_string(load.size()) + " loads");
  if (load.empty()) return bias;
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / double(load.size());
  std::vector<double> delta(load.size());
  double delta_mean = 0;
  for (size_t i = 0; i < load.size(); ++i) {
    const double d = mean - load[i];
    delta[i] = coeff * double((d > 0) - (d < 0));
    delta_mean += delta[i];
  }
  delta_mean /= double(load.size());
  std::vector<float> out(bias.size());
  for (size_t i = 0; i < bias.size(); ++i) out[i] = float(double(bias[i]) + delta[i] - delta_mean);
  return out;
}

}  // namespace meshtrain
