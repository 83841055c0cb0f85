#pragma once
/// @file WeightGradQueue: the weight-gradient half of a split backward. Zero-bubble pipeline
/// schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"; PyTorch's
/// ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble) split each unit's backward into
/// "I" (backward_input: the gradient w.r.t. the unit's input, on the critical path to the
/// previous stage) and "W" (backward_weight: the parameter gradients, which nothing downstream
/// waits for and which the schedule places in pipeline bubbles). With
/// StepContext::defer_weight_grads set, the layers run I and record each parameter's gradient
/// term here; run() is W.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "device/device.hpp"
#include "model/parameter.hpp"

namespace meshtrain {

/// Deferred weight-gradient terms of one micro-batch's backward (usually one unit's), in
/// recording order.
///
/// What is recorded: the operands of each term — activations and output gradients — as Tensor
/// handles, so their storage stays alive until run() or clear() (bytes_held() says how much).
/// The queue copies nothing: a recorded tensor must not be written in place before run() (the
/// layers record the tensor a term actually reads, e.g. the gradient after RoPE's inverse
/// rotation, the logits buffer after the loss overwrote it with its gradient).
///
/// Parameters are recorded by address and their `grad` is looked up when run() executes, not
/// when the term is recorded: FSDP binds Parameter::grad to a unit's unsharded buffer only while
/// the unit is gathered, so W must run while it is (again). Each Parameter must outlive the
/// queue's use of it.
///
/// Running the terms in recording order issues the same kernels on the same operands in the
/// same order as the fused backward, so on a given device and thread count the gradients are
/// bitwise those of a fused backward (tested on the CPU backend).
class WeightGradQueue {
 public:
  /// Records w.grad [out, in] += dyᵀ · x (linear_backward's weight term, y = x · Wᵀ):
  /// dy [N, out], x [N, in], both w's compute dtype; w's tp-local shape [out, in].
  /// @throws std::invalid_argument naming w when the shapes disagree.
  void linear(const Tensor& dy, const Tensor& x, const Parameter& w);
  /// Records w.grad [D] += Σ_n dy[n, :] · x[n, :] · rstd[n] (RMSNorm's weight term,
  /// Device::rmsnorm_backward_weight): dy, x [N, D], rstd f32 [N] saved by the forward.
  /// @throws std::invalid_argument naming w when the shapes disagree.
  void rmsnorm(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Parameter& w);
  /// Records the experts' weight term, w.grad [G, P, Q] += per group g dy_gᵀ · x_g
  /// (Device::grouped_matmul, kBackwardWeight): dy [R, P], x [R, Q], counts[g] rows per group
  /// (R = Σ counts). @throws std::invalid_argument naming w when the shapes disagree.
  void grouped_linear(const Tensor& dy, const Tensor& x, std::vector<int64_t> counts, const Parameter& w);
  /// Records the embedding's scatter-add (Device::embedding_backward): row tokens[n] −
  /// vocab_start of w.grad [V_local, D] accumulates grad_out[n, :] for the ids this shard holds;
  /// grad_out [N, D], tokens i32 [N]. @throws std::invalid_argument naming w when the shapes
  /// disagree.
  void embedding(const Tensor& grad_out, const Tensor& tokens, const Parameter& w, int64_t vocab_start);

  /// Runs every recorded term, in recording order, into each parameter's current `grad`
  /// binding, then clears the queue. Every binding is checked before any term runs, so a
  /// failure leaves all gradients and the queue untouched (run again once they are bound).
  /// @throws std::logic_error naming the parameter when its grad is unbound or no longer of
  /// its tp-local shape; the device's exceptions from the kernels.
  void run(Device& dev);

  bool empty() const { return terms_.empty(); }
  /// Recorded terms not yet run.
  size_t size() const { return terms_.size(); }
  /// Bytes of the distinct tensors the queue keeps alive (dy, x, rstd, grad_out, tokens),
  /// each buffer counted once however many terms read it (wq, wk and wv share their x): for
  /// memory accounting and logs.
  int64_t bytes_held() const;
  /// Drops every recorded term without running it (releases the tensors).
  void clear() { terms_.clear(); }

 private:
  enum class Kind { kLinear, kRmsNorm, kEmbedding, kGroupedLinear };
  struct Term {
    Kind kind;
    const Parameter* param;
    Tensor a, b, c;           ///< linear (dy, x); rmsnorm (dy, x, rstd); embedding (grad_out, tokens)
    int64_t vocab_start = 0;  ///< embedding only
    std::vector<int64_t> counts;  ///< grouped linear only
  };
  std::vector<Term> terms_;
};

}  // namespace meshtrain
