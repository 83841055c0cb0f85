#pragma once
/// @file Shared building blocks of the layers: linear maps (y = x·Wᵀ, Wᵀ stored as PyTorch's
/// [out, in]) and RMSNorm, each with its backward. The backward functions read the device and
/// the split-backward switch from the step context: with ctx.defer_weight_grads set they
/// compute the input gradient only and record the weight term there (weight_grad_queue.hpp).
#include "model/layer.hpp"

namespace meshtrain {

/// y [N, out] = x [N, in] · Wᵀ, W [out, in]. Under Float8 training (w.float8 set) every GEMM of
/// these linear functions reads its operands through the recipe's casts (Device::float8_cast:
/// quantize → dequantize to e4m3 / e5m2 with dynamic scales, TorchAO's Float8Linear) and
/// accumulates in f32; x, dy and the master weight themselves stay as they are.
Tensor linear_forward(Device& dev, const Tensor& x, const Parameter& w, MemCategory cat = MemCategory::kActivations);
/// y [N, out] = x [N, in] · Wᵀ into a given y (f32 router logits from activation-dtype x).
void linear_forward_into(Device& dev, const Tensor& x, const Parameter& w, const Tensor& y);
/// dx [N, in] = dy · W (or, when accumulate_dx is given, dx += dy · W); dW += dyᵀ · x, or that
/// term deferred. dy [N, out], x [N, in] (the forward's input), W [out, in].
Tensor linear_backward(const StepContext& ctx, const Tensor& dy, const Tensor& x, const Parameter& w,
                       const Tensor* accumulate_dx = nullptr);
/// The two GEMMs of a linear layer whose left operand A has N rows: the forward (x [N, in] · Wᵀ
/// → [N, out]) and the input gradient (dy [N, out] · W → [N, in]).
enum class LinearGemm { kForward, kInputGrad };

/// One such GEMM prepared for row blocks of A, multiplied one by one (async TP multiplies each
/// block as it arrives, model/async_tensor_parallel.hpp): W's operand with its Float8 amax
/// (reduced over tp where the recipe's groups span the split) computed once, and how A is cast
/// (TorchAO's Float8Linear recipes, as linear_forward applies them). linear_rows_plan builds it.
struct LinearRows {
  const Parameter* w = nullptr;
  LinearGemm gemm = LinearGemm::kForward;
  Float8Operand rhs;  ///< W's compute copy [out, in] and its cast (quantize false: high precision)
  Float8Cast lhs;     ///< A's cast (quantize false: A is read as it is)
};
/// W's side of w's GEMM `g` as linear_forward / linear_backward read it. @throws CommError (W's
/// amax all-reduce over tp, blocking).
LinearRows linear_rows_plan(Device& dev, const Parameter& w, LinearGemm g);
/// Whether row blocks of A can be cast on their own, with a slice of the whole A's amax: A is
/// not quantized, or its groups are the tensor or its rows (not its columns). Throws nothing.
bool linear_rows_separable(const Parameter& w, LinearGemm g);
/// The amax of A's scaling groups [float8_group_count] over the whole A [N, K] of this rank,
/// reduced over tp where the groups span the split, as linear_forward / linear_backward compute
/// it; undefined when A is not quantized. @throws CommError.
Tensor linear_rows_amax(Device& dev, const LinearRows& p, const Tensor& a);
/// out [n, cols] = A' · op(W') + beta · out for rows a_rows [n, K] of A, A' and W' the operands
/// after their casts, A's scales from amax_rows (its groups that those rows hold: [1]
/// tensorwise, [n] rowwise; undefined when A is not quantized): the rows of the GEMM that
/// linear_forward / linear_backward run over the whole A. @throws std::invalid_argument for an A
/// whose row blocks are not separable (linear_rows_separable); errors of the device's GEMMs.
void linear_rows_gemm(Device& dev, const LinearRows& p, const Tensor& a_rows, const Tensor& amax_rows,
                      const Tensor& out, float beta);

/// w.grad [out, in] += dyᵀ · x: linear_backward's weight term, also run by the split backward's
/// WeightGradQueue. dy [N, out], x [N, in].
void linear_weight_grad(Device& dev, const Tensor& dy, const Tensor& x, const Parameter& w);

/// tp_exit (model/tensor_parallel.hpp) of a block's row-parallel output under per-operator
/// checkpointing: a reduce-scatter's output (sequence parallelism) is kept (SacOp::kCollective),
/// as TorchTitan keeps reduce_scatter_tensor; tp's all-reduce is redone on recomputation, as
/// TorchTitan redoes all_reduce and all_gather. partial [N, D] → [N/tp, D] or [N, D].
/// @throws CommError.
Tensor tp_exit_kept(Device& dev, SavedTensors& saved, const TensorParallel& tp, const Tensor& partial);

/// RMSNorm over the last dim of x [N, D] with weight [D]; pushes x and rstd.
Tensor rmsnorm_forward(Device& dev, SavedTensors& saved, const Tensor& x, const Parameter& w, float eps);
/// Pops what rmsnorm_forward pushed; returns dx [N, D] from dy [N, D]; accumulates dW [D] (or
/// defers it).
Tensor rmsnorm_backward(const StepContext& ctx, SavedTensors& saved, const Tensor& dy, const Parameter& w);
/// The residual add fused with the next RMSNorm: h [N, D] += delta (in place), returns
/// rmsnorm(h) [N, D]; pushes h and rstd like rmsnorm_forward.
Tensor add_rmsnorm_forward(Device& dev, SavedTensors& saved, const Tensor& h, const Tensor& delta, const Parameter& w,
                           float eps);
/// Pops what add_rmsnorm_forward pushed; returns residual + ∂rmsnorm/∂h · dy [N, D] (the
/// gradient reaching h from both the norm and the residual branch); accumulates dW (or defers
/// it).
Tensor rmsnorm_backward_residual(const StepContext& ctx, SavedTensors& saved, const Tensor& dy, const Parameter& w,
                                 const Tensor& residual);

}  // namespace meshtrain
