#pragma once
/// @file Executor: runs a model part — a contiguous range of units — forward and backward, one
/// micro-batch per call, with several micro-batches in flight (pipeline schedules). It owns the
/// saved activations of every micro-batch between its forward and its backward, drops and
/// recomputes them per the activation-checkpointing policy, and calls per-unit hooks with the
/// micro-batch id (the attachment points of FSDP, DDP bucketing and mixed precision).
///
/// Operations on micro-batch mb (the pipeline schedules' F, B, I and W actions):
///  - forward(mb): units in order; the first unit of the whole model embeds ctx.tokens, the
///    last computes the loss into ctx.loss_sum; otherwise the input is the previous stage's
///    activation [N, D] and the output goes to the next stage;
///  - backward(mb): fused backward in reverse order, gradients accumulated into the parameters'
///    grad buffers, returns the gradient w.r.t. the part's input [N, D] (empty on the first
///    stage) and frees mb's saved activations;
///  - backward_input(mb) + backward_weight(mb): the same split in two (Qi et al. 2023, "Zero
///    Bubble Pipeline Parallelism"): backward_input computes every dX now and records the
///    weight-gradient terms (saved inputs and output gradients, model/weight_grad_queue.hpp);
///    backward_weight computes them later, into the same grad buffers, with the same bits.
/// Each unit's forward, recomputation, backward and weight gradient is a trace span
/// (util/trace.hpp: name = the unit's name, category "forward" / "recompute" / "backward" /
/// "backward_weight"); the hooks' collectives are spans of their own.
///
/// Buffer lifetimes: a micro-batch's SavedTensors (and, for recomputed units, the unit inputs)
/// live from forward(mb) until backward(mb) or backward_weight(mb); in split mode the weight
/// queue holds its output gradients and inputs from backward_input until backward_weight. The
/// peak in flight is therefore the schedule's in-flight micro-batches × one micro-batch's
/// activations.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "model/layer.hpp"
#include "model/weight_grad_queue.hpp"

namespace meshtrain {

/// Callbacks around each unit; unit indices are the model's (Transformer::units() order), so a
/// strategy can serve several executors (one per pipeline stage on a rank). `mb` is the
/// micro-batch id the call belongs to (−1 for forward-only evaluation).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void pre_forward(size_t unit, int64_t mb) {}
  virtual void post_forward(size_t unit, int64_t mb) {}
  /// Before the unit's backward (or backward_input) of mb.
  virtual void pre_backward(size_t unit, int64_t mb) {}
  /// The unit's parameter gradients for mb are complete (after its fused backward, or after
  /// its deferred weight gradients in split mode).
  virtual void post_backward(size_t unit, int64_t mb) {}
};

/// Activation checkpointing (Chen et al. 2016): "none" keeps every activation; "full"
/// recomputes every transformer block's forward during backward; "selective" with period N
/// recomputes every N-th block (TorchTitan's layer-based selective AC); "selective" with option
/// "op" is per-operator selective AC in every block: the outputs of attention, of tp's
/// reduce-scatter and ep's all-to-all and of every second matmul (the 1st, 3rd, … of the block)
/// are kept, the rest (norms, SwiGLU, RoPE, the other matmuls, the MoE router and experts) is
/// recomputed before the block's backward (SavedTensors::op, model/layer.hpp).
struct CheckpointPolicy {
  enum class Mode { kNone, kSelective, kFull, kOp } mode = Mode::kNone;
  int64_t every = 1;
  /// Whether unit u (block index `block` ≥ 0; −1 for embedding/head) is recomputed (wholly, or
  /// for kOp all but its kept operators).
  bool recompute(int64_t block) const;
  /// Parses the deck's [activation_checkpoint] mode and selective_ac_option (a positive integer,
  /// or "op"). @throws std::invalid_argument on other values (config validation rejects them first).
  static CheckpointPolicy from_deck(const std::string& mode, const std::string& selective_option);
};

class Executor {
 public:
  /// units: the model's units in execution order; block_index[u] = transformer block number or
  /// −1 (Transformer::block_index()). This executor runs units [first, last) of them (default:
  /// all), calling hooks with the model's unit indices.
  /// @throws std::invalid_argument on mismatched sizes or an empty / out-of-range range.
  Executor(std::vector<Layer*> units, std::vector<int64_t> block_index, CheckpointPolicy policy, size_t first = 0,
           size_t last = SIZE_MAX);
  void set_hooks(UnitHooks* hooks) { hooks_ = hooks; }

  /// Forward of micro-batch mb: `input` is the previous stage's activation [N, D] (empty when
  /// the range starts with the embedding). Returns this range's output [N, D], or an empty
  /// tensor when it ends with the output head (the loss is added to ctx.loss_sum). With
  /// ctx.need_backward, saves what backward needs under mb; otherwise saves nothing.
  /// @throws std::logic_error when mb is already in flight.
  Tensor forward(int64_t mb, StepContext& ctx, const Tensor& input);
  /// Fused backward of mb from `dout` [N, D], the gradient of this range's output (empty when
  /// it ends with the head). Returns the gradient w.r.t. the input (empty when the range starts
  /// with the embedding). @throws std::logic_error when mb has no forward in flight.
  Tensor backward(int64_t mb, StepContext& ctx, const Tensor& dout);
  /// backward's first half: every dX, weight gradients recorded for backward_weight(mb).
  Tensor backward_input(int64_t mb, StepContext& ctx, const Tensor& dout);
  /// backward's second half: the weight gradients backward_input(mb) recorded, unit by unit in
  /// backward order (post_backward fires per unit). @throws std::logic_error without it.
  void backward_weight(int64_t mb);
  /// forward(0, …) then backward(0, …) through the whole range (no pipeline).
  void forward_backward(StepContext& ctx);
  /// Forward only (validation): nothing is saved, no hooks beyond pre/post_forward (mb −1).
  Tensor forward_only(StepContext& ctx, const Tensor& input = Tensor());

  /// Micro-batches with saved state (forward done, backward or backward_weight pending).
  size_t in_flight() const { return state_.size(); }
  size_t first_unit() const { return first_; }
  size_t last_unit() const { return last_; }

 private:
  struct MicroBatch {
    std::vector<SavedTensors> saved;                 // per unit of the range
    std::vector<Tensor> inputs;                      // unit inputs kept for recomputation
    std::vector<WeightGradQueue> weight_grads;       // split mode: per unit, from backward_input
    bool input_done = false;                         // backward_input ran
  };
  Tensor run_backward(int64_t mb, StepContext& ctx, const Tensor& dout, bool split);
  MicroBatch& at(int64_t mb, const char* op);

  std::vector<Layer*> units_;
  std::vector<int64_t> block_index_;
  CheckpointPolicy policy_;
  size_t first_, last_;
  UnitHooks* hooks_ = nullptr;
  std::map<int64_t, MicroBatch> state_;
  Device* dev_ = nullptr;  // from the last forward's context (backward_weight has none)
};

}  // namespace meshtrain
