#pragma once
/// @file Executor: runs the graph of units forward and backward for one micro-batch, owns the
/// saved activations, drops and recomputes them per the activation-checkpointing policy, and
/// calls per-unit hooks in order (the attachment points of FSDP and DDP bucketing). Each unit's
/// forward, recomputation and backward is a trace span (util/trace.hpp: name = the unit's name,
/// category "forward" / "recompute" / "backward"), the hooks' collectives are spans of their own.
#include <vector>

#include "model/layer.hpp"

namespace meshtrain {

/// Callbacks around each unit; unit indices follow Executor::units() order.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void pre_forward(size_t unit) {}
  virtual void post_forward(size_t unit) {}
  virtual void pre_backward(size_t unit) {}
  /// The unit's parameter gradients for this micro-batch are complete.
  virtual void post_backward(size_t unit) {}
};

/// Activation checkpointing (Chen et al. 2016): "none" keeps every activation; "full"
/// recomputes every transformer block's forward during backward; "selective" with period N
/// recomputes every N-th block (TorchTitan's layer-based selective AC).
struct CheckpointPolicy {
  enum class Mode { kNone, kSelective, kFull } mode = Mode::kNone;
  int64_t every = 1;
  /// Whether unit u (block index `block` ≥ 0; −1 for embedding/head) is recomputed.
  bool recompute(int64_t block) const;
  /// Parses the deck's [activation_checkpoint] mode and selective_ac_option (a positive integer).
  /// @throws std::invalid_argument on other values (config validation rejects them first).
  static CheckpointPolicy from_deck(const std::string& mode, const std::string& selective_option);
};

class Executor {
 public:
  /// units: in execution order; block_index[u] = transformer block number or −1.
  Executor(std::vector<Layer*> units, std::vector<int64_t> block_index, CheckpointPolicy policy);
  void set_hooks(UnitHooks* hooks) { hooks_ = hooks; }

  /// Forward through every unit and backward in reverse: gradients accumulate into the
  /// parameters' grad buffers; the loss sum lands in ctx.loss_sum. Saved activations are
  /// released as backward consumes them.
  void forward_backward(StepContext& ctx);
  /// Forward only (validation): nothing is saved, no hooks beyond pre/post_forward.
  void forward(StepContext& ctx);

 private:
  std::vector<Layer*> units_;
  std::vector<int64_t> block_index_;
  CheckpointPolicy policy_;
  UnitHooks* hooks_ = nullptr;
  std::vector<SavedTensors> saved_;
  std::vector<Tensor> inputs_;  // unit inputs kept for recomputation
};

}  // namespace meshtrain
