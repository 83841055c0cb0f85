#pragma once
/// @file GradientSync: what a data-parallel strategy (DDP, ZeRO-1/2, FSDP, HSDP) does around the
/// executor's units and the optimizer step, so the trainer drives every strategy the same way
/// (DESIGN.md data flow step 8). Implementations: DataParallel (replicated parameters and
/// gradients) and ShardedDataParallel (parallel/fsdp/).
#include <vector>

#include "comm/communicator.hpp"
#include "graph/executor.hpp"
#include "model/transformer.hpp"

namespace meshtrain {

/// The part of one parameter this rank updates: `value` and `grad` are flat [n] views of equal
/// numel (n = the whole parameter when replicated, this rank's dim-0 rows when sharded; n may be
/// 0 when a tensor has fewer rows than the shard group).
struct LocalShard {
  Parameter* param = nullptr;
  Tensor value;
  Tensor grad;
  int64_t first_elem = 0;  ///< where `value` starts in the parameter's tp-local tensor (whole rows)
};

/// Every parameter of a model holding replicated parameters and gradients, whole, in model
/// order. @throws std::logic_error when the model does not hold them.
std::vector<LocalShard> replicated_shards(const Transformer& model);
/// Σ g² over the gradients of `shards` on this rank only (fp64), a parameter replicated over a
/// tp group of T ranks weighted 1/T (so summing the result over tp counts it once), a pipeline
/// stage's tied copy (ShardingSpec::tied_copy) not at all (its original counts). `each`, when
/// given, receives the term of every shard (index = shard index; 0 for an empty shard), from the
/// same pass: a non-finite term names a parameter whose gradient holds a NaN or inf.
double local_sum_squares(Device& dev, const std::vector<LocalShard>& shards, std::vector<double>* each = nullptr);

class GradientSync : public UnitHooks {
 public:
  /// Call before a training micro-batch's forward, and again before each of its backward
  /// calls (fused, or backward_weight in split mode). `first`: this is the step's first
  /// backward of the units it covers on this rank (their reductions overwrite the gradient
  /// shards); `last`: the step's last (it arms the once-per-step reductions: DDP's all-reduce,
  /// ZeRO-1's reduce-scatter, HSDP's all-reduce). Pipeline schedules derive both from their
  /// action lists, per stage, not from the order in which micro-batches begin.
  virtual void set_micro_batch_role(bool first, bool last) = 0;
  /// Micro-batch `m` of `accum` run one after the other (m counts from 0).
  void begin_micro_batch(int64_t m, int64_t accum) { set_micro_batch_role(m == 0, m + 1 == accum); }
  /// Switches the hooks to forward-only evaluation (validation): nothing is reduced and
  /// gathered parameters are released after each unit's forward. Training mode is restored by
  /// the next begin_micro_batch().
  virtual void begin_evaluation() = 0;
  /// Waits for every gradient reduction of the step; afterwards local_shards() hold the
  /// step's fully reduced gradients. @throws CommError.
  virtual void finish_gradients() = 0;
  /// This rank's pieces of every parameter, in model order, for the optimizer; stable for the
  /// object's lifetime.
  virtual const std::vector<LocalShard>& local_shards() const = 0;
  /// Σ g² (local_sum_squares) reduced over the data-parallel ranks that hold disjoint pieces;
  /// summed over tp (grad_norm) it is the square of the global gradient norm, every
  /// parameter counted once. `each` receives this rank's unreduced term per local shard
  /// (local_sum_squares). Collective. @throws CommError.
  virtual double grad_sum_squares(Device& dev, std::vector<double>* each = nullptr) = 0;
  /// Called after the optimizer updated local_shards(): sharded strategies mark replicated
  /// copies stale and start gathering them (ZeRO-1/2), overlapping the next forward.
  virtual void after_optimizer_step() {}
  /// Makes every parameter's full value available in Parameter::value (for a dump or an
  /// export) until release_full_parameters(). Collective.
  virtual void gather_full_parameters() {}
  virtual void release_full_parameters() {}
  /// Whether a forward pass runs collectives (parameters are gathered), so every rank of the
  /// group must run the same number of forwards.
  virtual bool forward_is_collective() const { return false; }
  /// Seconds this rank spent blocked waiting for gradient / parameter collectives since the
  /// last call (the step's communication wait), then resets the counter.
  virtual double take_comm_wait_seconds() = 0;
};

}  // namespace meshtrain
