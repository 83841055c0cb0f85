#include "model/layers/primitives.hpp"

#include <stdexcept>

#include "comm/communicator.hpp"
#include "model/weight_grad_queue.hpp"
#include "tensor/float8.hpp"

namespace meshtrain {

namespace {
// Which dimension of a linear layer's operand is split over tp (−1: none). A column-parallel
// weight W [out/tp, in] (tp_dim 0) reads the whole x [N, in] and gives dy [N, out/tp]; a
// row-parallel one W [out, in/tp] (tp_dim 1) reads x [N, in/tp] and gets the whole dy [N, out].
enum class Operand { kX, kW, kDy };
int split_dim(const Parameter& w, Operand o) {
  const int d = w.sharding.tp_dim;
  if (d < 0) return -1;
  if (o == Operand::kW) return d;
  if (o == Operand::kX) return d == 1 ? 1 : -1;
  return d == 0 ? 1 : -1;
}

// Whether a scaling group reaches across the split: a tensorwise group always, a row (spanning
// the columns) when the columns are split, a column when the rows are.
bool group_spans_split(Float8Scaling s, int split) {
  if (split < 0) return false;
  return s == Float8Scaling::kTensorwise || (s == Float8Scaling::kRowwise) == (split == 1);
}

// An operand of a Float8 GEMM before its cast. Under tp, a scaling group split across the
// ranks gets the max of their amax first, so every rank scales it as one tensor would
// (blocking, on the tp group).
Float8Operand float8_source(Device& dev, const Tensor& t, const Parameter& w, Float8Cast Float8LinearRecipe::*cast,
                            Operand role) {
  Float8Operand o{t, (*w.float8).*cast, Tensor()};
  if (!o.cast.quantize || !w.float8_tp || !group_spans_split(o.cast.scaling, split_dim(w, role))) return o;
  o.amax = dev.empty({float8_group_count(t.dim(0), t.dim(1), o.cast.scaling)}, DType::kF32, MemCategory::kTemporaries);
  dev.float8_amax(t, o.cast.scaling, o.amax);
  w.float8_tp->all_reduce(o.amax, ReduceOp::kMax)->wait();
  return o;
}

// The operand as a high-precision GEMM reads it: its cast into a temporary (freed after the
// GEMM; backward casts again from the saved high-precision tensors, as TorchAO's rowwise
// recipes do), or the tensor itself (no recipe, or the recipe leaves this operand unquantized).
Tensor float8_operand(Device& dev, const Tensor& t, const Parameter& w, Float8Cast Float8LinearRecipe::*cast,
                      Operand role) {
  if (!w.float8 || !((*w.float8).*cast).quantize) return t;
  const Float8Operand o = float8_source(dev, t, w, cast, role);
  Tensor q = dev.empty(t.shape(), t.dtype(), MemCategory::kTemporaries);
  if (o.amax.defined())
    dev.float8_cast_with_amax(t, o.cast, w.float8->power_of_two, o.amax, q);
  else
    dev.float8_cast(t, o.cast, w.float8->power_of_two, q);
  return q;
}

// One GEMM c = alpha·op(a)·op(b) + beta·c of a linear layer: with both operands quantized by
// w's recipe, Device::float8_matmul (FP8 GEMMs where the device has them and the recipe does
// not emulate); otherwise an ordinary matmul of the operands as float8_operand gives them
// (rowwise_with_gw_hp's high-precision weight gradient).
using R = Float8LinearRecipe;
void linear_gemm(Device& dev, const Parameter& w, const Tensor& a, Float8Cast R::*ca, Operand ra, bool ta,
                 const Tensor& b, Float8Cast R::*cb, Operand rb, bool tb, const Tensor& c, float beta) {
  if (w.float8 && ((*w.float8).*ca).quantize && ((*w.float8).*cb).quantize) {
    const Float8Operand oa = float8_source(dev, a, w, ca, ra);
    const Float8Operand ob = float8_source(dev, b, w, cb, rb);
    dev.float8_matmul(oa, ta, ob, tb, w.float8->power_of_two, w.float8->emulate, c, 1.0f, beta);
    return;
  }
  const Tensor qa = float8_operand(dev, a, w, ca, ra);
  const Tensor qb = float8_operand(dev, b, w, cb, rb);
  dev.matmul(qa, ta, qb, tb, c, 1.0f, beta);
}
}  // namespace

void linear_forward_into(Device& dev, const Tensor& x, const Parameter& w, const Tensor& y) {
  linear_gemm(dev, w, x, &R::output_x, Operand::kX, false, w.compute_value(), &R::output_w, Operand::kW, true, y,
              0.0f);
}

Tensor linear_forward(Device& dev, const Tensor& x, const Parameter& w, MemCategory cat) {
  Tensor y = dev.empty({x.dim(0), w.compute_value().dim(0)}, x.dtype(), cat);
  linear_forward_into(dev, x, w, y);
  return y;
}

void linear_weight_grad(Device& dev, const Tensor& dy, const Tensor& x, const Parameter& w) {
  linear_gemm(dev, w, dy, &R::grad_weight_dy, Operand::kDy, true, x, &R::grad_weight_x, Operand::kX, false, w.grad,
              1.0f);
}

Tensor linear_backward(const StepContext& ctx, const Tensor& dy, const Tensor& x, const Parameter& w,
                       const Tensor* accumulate_dx) {
  Device& dev = *ctx.dev;
  const Tensor& wc = w.compute_value();
  if (ctx.defer_weight_grads)
    ctx.defer_weight_grads->linear(dy, x, w);
  else
    linear_weight_grad(dev, dy, x, w);
  const Tensor dx =
      accumulate_dx ? *accumulate_dx : dev.empty({dy.dim(0), wc.dim(1)}, dy.dtype(), MemCategory::kActivations);
  linear_gemm(dev, w, dy, &R::grad_input_dy, Operand::kDy, false, wc, &R::grad_input_w, Operand::kW, false, dx,
              accumulate_dx ? 1.0f : 0.0f);
  return dx;
}

namespace {
// The recipe's casts of a linear GEMM's left and right operands, and the left one's role.
Float8Cast R::*lhs_cast(LinearGemm g) { return g == LinearGemm::kForward ? &R::output_x : &R::grad_input_dy; }
Float8Cast R::*rhs_cast(LinearGemm g) { return g == LinearGemm::kForward ? &R::output_w : &R::grad_input_w; }
Operand lhs_role(LinearGemm g) { return g == LinearGemm::kForward ? Operand::kX : Operand::kDy; }
}  // namespace

LinearRows linear_rows_plan(Device& dev, const Parameter& w, LinearGemm g) {
  LinearRows p{&w, g, Float8Operand{w.compute_value(), Float8Cast{}, Tensor()}, Float8Cast{}};
  if (!w.float8) return p;
  p.rhs = float8_source(dev, w.compute_value(), w, rhs_cast(g), Operand::kW);
  p.lhs = (*w.float8).*lhs_cast(g);
  return p;
}

bool linear_rows_separable(const Parameter& w, LinearGemm g) {
  return !w.float8 || !((*w.float8).*lhs_cast(g)).quantize ||
         ((*w.float8).*lhs_cast(g)).scaling != Float8Scaling::kColumnwise;
}

Tensor linear_rows_amax(Device& dev, const LinearRows& p, const Tensor& a) {
  if (!p.lhs.quantize) return Tensor();
  Float8Operand o = float8_source(dev, a, *p.w, lhs_cast(p.gemm), lhs_role(p.gemm));
  if (!o.amax.defined()) {
    o.amax = dev.empty({float8_group_count(a.dim(0), a.dim(1), o.cast.scaling)}, DType::kF32,
                       MemCategory::kTemporaries);
    dev.float8_amax(a, o.cast.scaling, o.amax);
  }
  return o.amax;
}

void linear_rows_gemm(Device& dev, const LinearRows& p, const Tensor& a_rows, const Tensor& amax_rows,
                      const Tensor& out, float beta) {
  if (!linear_rows_separable(*p.w, p.gemm))
    throw std::invalid_argument("linear_rows_gemm: " + p.w->name + "'s left operand is scaled by columns");
  const bool trans = p.gemm == LinearGemm::kForward;
  if (p.lhs.quantize && p.rhs.cast.quantize) {  // as linear_gemm: the Float8 GEMM
    dev.float8_matmul(Float8Operand{a_rows, p.lhs, amax_rows}, false, p.rhs, trans, p.w->float8->power_of_two,
                      p.w->float8->emulate, out, 1.0f, beta);
    return;
  }
  // One operand in high precision (rowwise_with_gw_hp's): casts into temporaries, then matmul.
  auto cast = [&](const Float8Operand& o) {
    if (!o.cast.quantize) return o.src;
    Tensor q = dev.empty(o.src.shape(), o.src.dtype(), MemCategory::kTemporaries);
    if (o.amax.defined())
      dev.float8_cast_with_amax(o.src, o.cast, p.w->float8->power_of_two, o.amax, q);
    else
      dev.float8_cast(o.src, o.cast, p.w->float8->power_of_two, q);
    return q;
  };
  dev.matmul(cast(Float8Operand{a_rows, p.lhs, amax_rows}), false, cast(p.rhs), trans, out, 1.0f, beta);
}

Tensor tp_exit_kept(Device& dev, SavedTensors& saved, const TensorParallel& tp, const Tensor& partial) {
  if (!tp.active() || !tp.sequence_parallel) return tp_exit(dev, tp, partial);
  // The block's residual add writes the shard in place: a kept shard is stashed as a copy.
  return saved.op(SacOp::kCollective, dev, [&] { return tp_exit(dev, tp, partial); }, true);
}

Tensor rmsnorm_forward(Device& dev, SavedTensors& saved, const Tensor& x, const Parameter& w, float eps) {
  const int64_t d = x.dim(-1), n = x.numel() / d;
  Tensor y = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  Tensor rstd = dev.empty({n}, DType::kF32, MemCategory::kActivations);
  dev.rmsnorm_forward(x, w.compute_value(), eps, y, rstd);
  saved.push(x);
  saved.push(rstd);
  return y;
}

namespace {
// The weight gradient the fused RMSNorm kernels accumulate into: w.grad, or nothing (an
// undefined tensor) when the term is deferred — recorded here with the operands it reads.
// An unbound w.grad must not reach the kernels, which would take it for "deferred".
Tensor norm_weight_grad(const StepContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                        const Parameter& w) {
  if (!ctx.defer_weight_grads) {
    if (!w.grad.defined()) throw std::logic_error("rmsnorm backward: " + w.name + " has no gradient bound");
    return w.grad;
  }
  ctx.defer_weight_grads->rmsnorm(dy, x, rstd, w);
  return Tensor();
}
}  // namespace

Tensor rmsnorm_backward(const StepContext& ctx, SavedTensors& saved, const Tensor& dy, const Parameter& w) {
  Device& dev = *ctx.dev;
  Tensor rstd = saved.pop();
  Tensor x = saved.pop();
  Tensor dx = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  dev.rmsnorm_backward(dy, x, w.compute_value(), rstd, dx, norm_weight_grad(ctx, dy, x, rstd, w));
  return dx;
}

Tensor add_rmsnorm_forward(Device& dev, SavedTensors& saved, const Tensor& h, const Tensor& delta, const Parameter& w,
                           float eps) {
  const int64_t n = h.numel() / h.dim(-1);
  Tensor y = dev.empty(h.shape(), h.dtype(), MemCategory::kActivations);
  Tensor rstd = dev.empty({n}, DType::kF32, MemCategory::kActivations);
  dev.add_rmsnorm_forward(h, delta, w.compute_value(), eps, y, rstd);
  saved.push(h);
  saved.push(rstd);
  return y;
}

Tensor rmsnorm_backward_residual(const StepContext& ctx, SavedTensors& saved, const Tensor& dy, const Parameter& w,
                                 const Tensor& residual) {
  Device& dev = *ctx.dev;
  Tensor rstd = saved.pop();
  Tensor x = saved.pop();
  Tensor dx = dev.empty(x.shape(), x.dtype(), MemCategory::kActivations);
  dev.rmsnorm_backward_residual(dy, x, w.compute_value(), rstd, residual, dx, norm_weight_grad(ctx, dy, x, rstd, w));
  return dx;
}

}  // namespace meshtrain
