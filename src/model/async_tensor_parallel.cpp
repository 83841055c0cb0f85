#include "model/async_tensor_parallel.hpp"

#include <memory>
#include <stdexcept>
#include <string>

#include "comm/communicator.hpp"
#include "model/weight_grad_queue.hpp"
#include "tensor/float8.hpp"

namespace meshtrain {

namespace {

// Tags of the two rings: a layer's fused entry and exit follow each other on the tp group, and
// over MPI distinct tags keep one ring's messages from matching the other's.
constexpr int kTagAllGather = 0x4147, kTagReduceScatter = 0x5253;

using Works = std::vector<std::unique_ptr<Work>>;

// One ring hop: `send` to rank + 1 and `recv` from rank − 1, posted together (NCCL needs the
// pair in one group, or two ranks sending to each other would wait on each other).
Works ring_step(const TensorParallel& tp, const Tensor& send, const Tensor& recv, int tag) {
  const int next = int((tp.rank + 1) % tp.size), prev = int((tp.rank + tp.size - 1) % tp.size);
  return tp.comm->send_recv_batch({P2POp{true, send, next, tag}, P2POp{false, recv, prev, tag}});
}

// MPI moves a message only while some MPI call runs: a test between GEMMs keeps a rendezvous
// transfer going while this rank computes.
void poll(const Works& works) {
  for (const auto& w : works) w->test();
}

void wait(Works& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

// Rows [b·n, (b+1)·n) of a contiguous [N, cols] tensor.
Tensor row_block(const Tensor& t, int64_t b, int64_t n) { return t.view({n, t.dim(1)}, b * n * t.dim(1)); }

// The output width and inner size of GEMM g over W [out, in].
int64_t gemm_cols(const Tensor& w, LinearGemm g) { return w.dim(g == LinearGemm::kForward ? 0 : 1); }
int64_t gemm_inner(const Tensor& w, LinearGemm g) { return w.dim(g == LinearGemm::kForward ? 1 : 0); }

void require_active(const TensorParallel& tp, const char* who) {
  if (!async_tp_active(tp))
    throw std::invalid_argument(std::string(who) + ": needs tp > 1, sequence parallelism and async TP on");
}

// W's side of every GEMM (Float8 amax all-reduces over tp happen here, before the ring starts, in
// the same order on every rank).
std::vector<LinearRows> plans(Device& dev, const std::vector<TpGemm>& gemms, const char* who) {
  std::vector<LinearRows> out;
  for (const TpGemm& g : gemms) {
    if (!linear_rows_separable(*g.w, g.gemm))
      throw std::invalid_argument(std::string(who) + ": " + g.w->name + "'s left operand is scaled by columns");
    out.push_back(linear_rows_plan(dev, *g.w, g.gemm));
  }
  return out;
}

// The amax of A's groups that rows [b·n, (b+1)·n) of A [N, K] hold: the tensor's one value, or
// those rows' (undefined stays undefined).
Tensor amax_rows(const Tensor& amax, int64_t b, int64_t n) {
  if (!amax.defined() || amax.numel() == 1) return amax;
  return amax.view({n}, b * n);
}

// Async TP where the layer's weights allow it: A's Float8 casts must be separable by rows.
bool fused(const TensorParallel& tp, const std::vector<const Parameter*>& weights, LinearGemm g) {
  if (!async_tp_active(tp)) return false;
  for (const Parameter* w : weights)
    if (!linear_rows_separable(*w, g)) return false;
  return true;
}

std::vector<TpGemm> gemms_of(const std::vector<const Parameter*>& weights, LinearGemm g) {
  std::vector<TpGemm> out;
  for (const Parameter* w : weights) out.push_back({w, g});
  return out;
}

// linear_backward's weight term alone: the fused operators compute the input gradient.
void weight_grad(const StepContext& ctx, const Tensor& dy, const Tensor& x, const Parameter& w) {
  if (ctx.defer_weight_grads)
    ctx.defer_weight_grads->linear(dy, x, w);
  else
    linear_weight_grad(*ctx.dev, dy, x, w);
}

}  // namespace

bool async_tp_active(const TensorParallel& tp) { return tp.active() && tp.sequence_parallel && tp.async; }

AllGatherMatmul all_gather_matmul(Device& dev, const TensorParallel& tp, const Tensor& a_local,
                                  const std::vector<TpGemm>& gemms) {
  require_active(tp, "all_gather_matmul");
  if (gemms.empty()) throw std::invalid_argument("all_gather_matmul: no GEMM");
  const int64_t n = a_local.dim(0), k = a_local.dim(1), size = tp.size, rank = tp.rank;
  const std::vector<LinearRows> p = plans(dev, gemms, "all_gather_matmul");
  AllGatherMatmul r;
  for (size_t i = 0; i < p.size(); ++i) {
    if (gemm_inner(p[i].rhs.src, p[i].gemm) != k)
      throw std::invalid_argument("all_gather_matmul: " + p[i].w->name + " does not take " + std::to_string(k) +
                                  " input features");
    r.outs.push_back(
        dev.empty({n * size, gemm_cols(p[i].rhs.src, p[i].gemm)}, a_local.dtype(), MemCategory::kActivations));
  }
  // A Float8 cast of A scales it by the amax of the whole gathered A. Tensorwise, that is the
  // max over tp of every block's amax, known before the ring starts; rowwise, a block's rows
  // have their own groups, taken as the block arrives.
  std::vector<Tensor> whole(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].lhs.quantize || p[i].lhs.scaling != Float8Scaling::kTensorwise) continue;
    whole[i] = dev.empty({1}, DType::kF32, MemCategory::kTemporaries);
    dev.float8_amax(a_local, p[i].lhs.scaling, whole[i]);
    tp.comm->all_reduce(whole[i], ReduceOp::kMax)->wait();
  }
  auto block_amax = [&](size_t i, const Tensor& rows) {
    if (!p[i].lhs.quantize || whole[i].defined()) return whole[i];
    Tensor amax = dev.empty({float8_group_count(rows.dim(0), rows.dim(1), p[i].lhs.scaling)}, DType::kF32,
                            MemCategory::kTemporaries);
    dev.float8_amax(rows, p[i].lhs.scaling, amax);
    return amax;
  };
  r.gathered = dev.empty({n * size, k}, a_local.dtype(), MemCategory::kActivations);
  dev.copy(row_block(r.gathered, rank, n), a_local);
  for (int64_t s = 0; s < size; ++s) {
    const int64_t b = (rank - s + size) % size;
    const Tensor rows = row_block(r.gathered, b, n);
    Works works;
    if (s + 1 < size) works = ring_step(tp, rows, row_block(r.gathered, (b + size - 1) % size, n), kTagAllGather);
    for (size_t i = 0; i < p.size(); ++i) {
      linear_rows_gemm(dev, p[i], rows, block_amax(i, rows), row_block(r.outs[i], b, n), 0.0f);
      poll(works);
    }
    wait(works);
  }
  return r;
}

Tensor matmul_reduce_scatter(Device& dev, const TensorParallel& tp, const std::vector<Tensor>& lhs,
                             const std::vector<TpGemm>& gemms) {
  require_active(tp, "matmul_reduce_scatter");
  if (gemms.empty() || lhs.size() != gemms.size())
    throw std::invalid_argument("matmul_reduce_scatter: " + std::to_string(lhs.size()) + " left operands for " +
                                std::to_string(gemms.size()) + " GEMMs");
  const int64_t rows = lhs[0].dim(0), size = tp.size, rank = tp.rank;
  if (rows % size)
    throw std::invalid_argument("matmul_reduce_scatter: " + std::to_string(rows) + " rows do not divide over tp " +
                                std::to_string(size));
  const int64_t n = rows / size;
  const std::vector<LinearRows> p = plans(dev, gemms, "matmul_reduce_scatter");
  int64_t cols = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    const int64_t c = gemm_cols(p[i].rhs.src, p[i].gemm);
    if (lhs[i].dim(0) != rows || gemm_inner(p[i].rhs.src, p[i].gemm) != lhs[i].dim(1) || (cols >= 0 && c != cols))
      throw std::invalid_argument("matmul_reduce_scatter: " + p[i].w->name + " does not fit the other operands");
    cols = c;
  }
  // A's Float8 amax over all its rows (and over tp where its groups span the split), as the
  // synchronous path takes it; only the GEMMs are cut into row blocks.
  std::vector<Tensor> amax;
  for (size_t i = 0; i < p.size(); ++i) amax.push_back(linear_rows_amax(dev, p[i], lhs[i]));
  const DType dtype = lhs[0].dtype();
  // This rank's partial product of row block `blk`, accumulated in `gemms` order as
  // linear_backward's accumulate_dx does, so every partial equals those rows of the whole sum.
  auto partial = [&](int64_t blk, const Tensor& out, const Works& works) {
    for (size_t i = 0; i < p.size(); ++i) {
      linear_rows_gemm(dev, p[i], row_block(lhs[i], blk, n), amax_rows(amax[i], blk, n), out, i ? 1.0f : 0.0f);
      poll(works);
    }
  };
  // Step s handles block rank − 1 − s; its accumulator is acc(s). They alternate between two
  // buffers (one in flight, one being received), arranged so that the last step's is `out`.
  Tensor out = dev.empty({n, cols}, dtype, MemCategory::kActivations);
  Tensor spare = dev.empty({n, cols}, dtype, MemCategory::kTemporaries);
  Tensor mine = dev.empty({n, cols}, dtype, MemCategory::kTemporaries);
  auto acc = [&](int64_t s) { return (size - 1 - s) % 2 == 0 ? out : spare; };
  auto block = [&](int64_t s) { return (rank - 1 - s + 2 * size) % size; };
  partial(block(0), acc(0), Works());
  for (int64_t s = 1; s < size; ++s) {
    Works works = ring_step(tp, acc(s - 1), acc(s), kTagReduceScatter);
    partial(block(s), mine, works);
    wait(works);
    dev.add(acc(s), mine, 1.0f);
  }
  return out;
}

AllGatherMatmul tp_region_enter(const StepContext& ctx, const Tensor& x_local,
                                const std::vector<const Parameter*>& weights) {
  if (fused(ctx.tp, weights, LinearGemm::kForward))
    return all_gather_matmul(*ctx.dev, ctx.tp, x_local, gemms_of(weights, LinearGemm::kForward));
  return {tp_enter(*ctx.dev, ctx.tp, x_local), {}};
}

Tensor tp_region_exit(const StepContext& ctx, SavedTensors& saved, const Tensor& h, const Parameter& w) {
  Device& dev = *ctx.dev;
  // The block's residual add writes the shard in place: a kept shard is stashed as a copy.
  if (fused(ctx.tp, {&w}, LinearGemm::kForward))
    return saved.op(SacOp::kCollective, dev,
                    [&] { return matmul_reduce_scatter(dev, ctx.tp, {h}, {{&w, LinearGemm::kForward}}); }, true);
  // The output is reduced in place (tp) or takes the block's residual add: kept as a copy.
  Tensor out = saved.op(SacOp::kMatmul, dev, [&] { return linear_forward(dev, h, w); }, true);
  return tp_exit_kept(dev, saved, ctx.tp, out);
}

Tensor tp_region_exit_backward(const StepContext& ctx, const Tensor& dout_local, const Tensor& h, const Parameter& w) {
  if (!fused(ctx.tp, {&w}, LinearGemm::kInputGrad))
    return linear_backward(ctx, tp_enter(*ctx.dev, ctx.tp, dout_local), h, w);
  AllGatherMatmul g = all_gather_matmul(*ctx.dev, ctx.tp, dout_local, {{&w, LinearGemm::kInputGrad}});
  weight_grad(ctx, g.gathered, h, w);
  return g.outs[0];
}

Tensor tp_region_enter_backward(const StepContext& ctx, const std::vector<Tensor>& dys, const Tensor& x,
                                const std::vector<const Parameter*>& weights) {
  if (fused(ctx.tp, weights, LinearGemm::kInputGrad)) {
    for (size_t i = 0; i < weights.size(); ++i) weight_grad(ctx, dys[i], x, *weights[i]);
    return matmul_reduce_scatter(*ctx.dev, ctx.tp, dys, gemms_of(weights, LinearGemm::kInputGrad));
  }
  Tensor dx = linear_backward(ctx, dys[0], x, *weights[0]);
  for (size_t i = 1; i < weights.size(); ++i) linear_backward(ctx, dys[i], x, *weights[i], &dx);
  return tp_exit(*ctx.dev, ctx.tp, dx);
}

}  // namespace meshtrain
