#pragma once
/// @file Layer: the node type of the graph of layers. A layer owns named parameters; forward
/// saves what backward needs on a SavedTensors stack the executor owns; backward pops it in
/// reverse order and accumulates parameter gradients (DESIGN.md, Core interfaces).
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "model/parameter.hpp"
#include "model/expert_parallel.hpp"
#include "model/tensor_parallel.hpp"
#include "parallel/context/context_parallel.hpp"

namespace meshtrain {

class WeightGradQueue;  // model/weight_grad_queue.hpp

/// The operators per-operator selective activation checkpointing tells apart (TorchTitan's
/// selective_ac_option = "op", torchtitan/distributed/activation_checkpoint.py): the outputs of
/// matmuls (every second one excepted), of attention and of reduce-scatter / all-to-all are
/// kept; every other operator is recomputed in backward.
enum class SacOp {
  kMatmul,      ///< a counted linear map (y = x·Wᵀ): kept when it is the 1st, 3rd, … of its unit's forward
  kAttention,   ///< the attention kernel (SDPA / flash; the ring or Ulysses exchange under cp)
  kCollective,  ///< a reduce-scatter or an all-to-all whose output feeds the forward
};

/// LIFO of activations saved by forward for backward, and the activation-checkpointing state of
/// one unit's forward:
///  - kKeep: pushes are stored (no checkpointing, or the recomputation of a full/selective-N unit);
///  - kDiscard: pushes are dropped; the executor recomputes the unit's forward before backward;
///  - kOpRecord: per-operator checkpointing, first forward: pushes are dropped, and the outputs
///    of the operators the policy keeps (op()) are stashed;
///  - kOpReplay: its recomputation before backward: pushes are stored, and op() hands back the
///    stashed outputs (in the order recorded) instead of running those operators again.
/// Recomputation runs the same kernels on the same inputs, so a replayed forward is bitwise the
/// first one; the stash only skips work (and, for collectives, communication).
class SavedTensors {
 public:
  enum class Mode { kKeep, kDiscard, kOpRecord, kOpReplay };
  void push(const Tensor& t) {
    if (!discard()) stack_.push_back(t);
  }
  /// @throws std::logic_error when empty (a backward without its forward).
  Tensor pop();
  void clear() { stack_.clear(); }
  bool empty() const { return stack_.empty(); }
  /// Sets the mode for the next forward (or recomputation) and restarts the matmul count.
  void set_mode(Mode m) {
    mode_ = m;
    matmuls_ = 0;
  }
  void set_discard(bool d) { set_mode(d ? Mode::kDiscard : Mode::kKeep); }
  Mode mode() const { return mode_; }
  /// Whether pushes are dropped (a forward whose unit will be recomputed, or evaluation).
  bool discard() const { return mode_ == Mode::kDiscard || mode_ == Mode::kOpRecord; }
  /// Whether the unit's forward must run again before its backward.
  bool needs_recompute() const { return discard(); }
  /// Runs one operator (its outputs in order) of a unit's forward under per-operator checkpointing: `run` computes its
  /// outputs. kKeep / kDiscard: runs it. kOpRecord: runs it and, when the policy keeps this
  /// operator, stashes its outputs — copies of them when `mutated_later` (a later operator of
  /// the forward writes them in place: RoPE, the residual add, tp's in-place all-reduce).
  /// kOpReplay: a kept operator's outputs come from the stash, others run again. The keep rule
  /// is TorchTitan's: attention and collectives always, the n-th kMatmul of this forward when
  /// n is odd (so the pattern is the same in the forward and its replay).
  /// @throws std::logic_error when a replay asks for more, or other, outputs than were recorded.
  std::vector<Tensor> op_multi(SacOp kind, Device& dev, const std::function<std::vector<Tensor>()>& run,
                         bool mutated_later);
  /// op_multi() for an operator with one output.
  Tensor op(SacOp kind, Device& dev, const std::function<Tensor()>& run, bool mutated_later);
  /// Stashed operator outputs not yet replayed (0 after a complete replay).
  size_t stashed() const { return stash_.size(); }
  /// Bytes of the stashed outputs (what per-operator checkpointing keeps for this unit).
  int64_t stashed_bytes() const;

 private:
  std::vector<Tensor> stack_;
  std::deque<std::vector<Tensor>> stash_;
  Mode mode_ = Mode::kKeep;
  int64_t matmuls_ = 0;  // kMatmul operators seen in this forward
};

/// Inputs and outputs of one micro-batch shared by all layers of the graph.
struct StepContext {
  Device* dev = nullptr;
  TensorParallel tp;         ///< the layers' tensor-parallel group (size 1: none)
  ContextParallel cp;        ///< the cp group (size 1: the whole sequence on this rank)
  ExpertParallel ep;         ///< the ep group of the MoE layers (size 1: every expert here)
  SequenceShard shard;       ///< this rank's chunks of each sample (one chunk of T when cp = 1)
  int64_t batch = 0;         ///< B, samples in this micro-batch
  int64_t seq_len = 0;       ///< tokens per sample on this rank: T, or T / cp (shard.local_len())
  Tensor tokens;             ///< i32 [B·seq_len] inputs, chunk-major (context_parallel.hpp); every tp rank
  Tensor targets;            ///< i32 [B·seq_len] next tokens, in the same order
  Tensor rope_cos, rope_sin; ///< [T, head_dim/2] for the global positions 0 … T − 1
  /// i32 [B, T] document starts of each whole sample (document_starts in attention.hpp), the
  /// same on every cp / tp / pp rank: attention's DocumentMask under attn_mask_type =
  /// "block_causal". Undefined: plain causal attention.
  Tensor doc_start;
  std::vector<int32_t> doc_start_host;  ///< the same [B, T] table in host memory (cp skips blocks by it)
  float loss_grad_scale = 0; ///< d(loss)/d(per-token CE): 1 / global target tokens
  bool need_backward = true; ///< false for validation (no gradients, nothing saved)
  /// dtype of activations and their gradients (f32; bf16 under mixed precision). Statistics
  /// (RMSNorm rstd, attention lse, loss stats) stay f32 whatever it is.
  DType act_dtype = DType::kF32;
  double loss_sum = 0;       ///< output: Σ CE over this micro-batch's targets (nats)
  int64_t num_targets = 0;   ///< output: targets counted in loss_sum
  /// MoE blocks route round-robin by sequence position instead of by score ([debug]
  /// moe_force_load_balance).
  bool moe_force_load_balance = false;
  WeightGradQueue* defer_weight_grads = nullptr;  ///< set: layers record dW terms here instead of computing them (split backward)
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual const std::string& name() const = 0;
  /// Parameters owned by this layer (and its sub-layers), in a fixed order.
  virtual std::vector<Parameter*> parameters() = 0;
  /// in/out shapes depend on the layer: embedding tokens → [N, D]; block [N, D] → [N, D];
  /// output head [N, D] → loss (in ctx.loss_sum); N = B·T, or B·T / tp under sequence
  /// parallelism (tp_local_tokens).
  virtual Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& in) = 0;
  /// Gradient w.r.t. `in` from the gradient w.r.t. the output (empty for the head and the
  /// embedding). Accumulates into parameter grads, or, when ctx.defer_weight_grads is set,
  /// records those terms there (WeightGradQueue::run accumulates them later, bitwise as here).
  virtual Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) = 0;
};

}  // namespace meshtrain
