#pragma once
/// @file StepSchedule: how the micro-batches of one optimizer step run through the executor.
/// The trainer hands every step to a schedule and then does what follows the micro-batches (the
/// strategy's last reductions, the loss and norm reductions, the non-finite check, the update).
/// Without pipeline parallelism the schedule is the plain gradient-accumulation loop below; the
/// pipeline schedules (GPipe, 1F1B, interleaved, zero-bubble) are other implementations that
/// interleave forward and backward of several micro-batches over stages.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/loader.hpp"
#include "graph/executor.hpp"
#include "model/transformer.hpp"
#include "parallel/grad_sync.hpp"
#include "train/parallel_context.hpp"

namespace meshtrain {

/// What a forward-only pass contributed on this rank: Σ CE (nats) and the targets counted.
struct EvalSums {
  double loss_sum = 0;
  int64_t targets = 0;
};

class StepSchedule {
 public:
  virtual ~StepSchedule() = default;
  /// Runs forward and backward of every micro-batch of optimizer step `step` on this rank, with
  /// the data-parallel strategy's hooks armed for the step's last micro-batch, reading the
  /// step's samples at the loader's cursor (the caller advances it). Leaves the local gradients
  /// accumulated and the strategy's reductions in flight (GradientSync::finish_gradients waits).
  /// Returns this rank's summed cross-entropy over its target tokens (nats; not yet reduced).
  /// @throws CommError from the collectives inside the layers and hooks.
  virtual double run(int64_t step) = 0;
  /// Forward only (validation) of `n` samples [n, seq_len + 1] (token ids) through this rank's
  /// part of the model, nothing saved; the caller reduces the sums over the data ranks.
  /// @throws CommError.
  virtual EvalSums evaluate(const int32_t* samples, int64_t n) = 0;
  /// The schedule's name for the start-up log ("gradient accumulation, 4 micro-batches").
  virtual std::string describe() const = 0;
};

/// No pipeline: `accum` micro-batches of [local_batch, seq_len] tokens one after the other, each
/// forward then backward through the whole model. Micro-batch m of this data rank holds samples
/// cursor + (m·dp + rank)·local_batch + [0, local_batch) (DataLoader::micro_batch), so the
/// global batch and its order do not depend on dp or accum.
class AccumulationSchedule : public StepSchedule {
 public:
  /// `loss_grad_scale` is 1 / (global batch · seq_len): the gradient of the global mean loss.
  /// `poisoned(step)` (may be empty) says whether this rank's last micro-batch of `step` gets a
  /// NaN loss-gradient scale ([debug] fault injection). All references must outlive the schedule.
  AccumulationSchedule(Transformer& model, Executor& exec, GradientSync& sync, const DataLoader& loader,
                       const ParallelContext& pc, int64_t local_batch, int64_t seq_len, int64_t accum,
                       float loss_grad_scale, std::function<bool(int64_t)> poisoned = {});
  double run(int64_t step) override;
  EvalSums evaluate(const int32_t* samples, int64_t n) override;
  std::string describe() const override;

 private:
  Transformer& model_;
  Executor& exec_;
  GradientSync& sync_;
  const DataLoader& loader_;
  ParallelContext pc_;
  int64_t local_batch_, seq_len_, accum_;
  float loss_grad_scale_;
  std::function<bool(int64_t)> poisoned_;
  std::vector<int32_t> samples_;  // [local_batch, seq_len + 1] token ids of the current micro-batch
};

}  // namespace meshtrain
