#pragma once
/// @file The non-finite guard (DESIGN.md data flow step 8: "a non-finite check before anything is
/// applied"). After a step's global reductions every rank holds the same loss and gradient norm;
/// when either is NaN or inf the optimizer step must not run, because one poisoned update spreads
/// NaN through every weight and AdamW moment, and the next checkpoint would preserve it.
///
/// Per step the trainer calls check() with the reduced loss and norm and the per-shard Σ g² terms
/// that the norm was built from (no extra pass over the gradients). The verdict is agreed over the
/// world in one all-reduce of two values, which also carries the preemption flag, so a rank whose
/// own numbers disagree (a silent fault on one device) still stops every rank at the same step.
/// Only on the failure path does a second all-reduce find the first parameter, in model order,
/// whose gradient shard is non-finite on any rank.
///
/// `[training] skip_nonfinite_steps = N` lets up to N such steps in a row pass without an update
/// (Megatron-LM's skipped iterations under fp16 loss scaling): the data of a skipped step is
/// consumed and the step counter advances, AdamW's step count t does not. Step N+1 in a row stops
/// the run with NonFiniteError (exit status 5).
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.hpp"
#include "model/transformer.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

/// What the trainer does with a checked step.
enum class StepVerdict {
  kApply,  ///< loss and gradient norm finite: clip, AdamW, continue
  kSkip,   ///< non-finite, within skip_nonfinite_steps in a row: no update, continue
};

/// The world-agreed verdict of one step, plus the preemption signal agreed in the same collective.
struct StepCheck {
  StepVerdict verdict = StepVerdict::kApply;
  int preempt_signal = 0;  ///< max over ranks of the pending SIGTERM / SIGUSR1 (0 = none)
  std::string message;     ///< kSkip: the one-line description of the skipped step
};

class NonFiniteGuard {
 public:
  /// `model` names parameters (model order = Transformer::parameters()); `shards` are the
  /// rank's local shards in the order of the per-shard terms passed to check(). Both must
  /// outlive the guard. `skip_limit` = [training] skip_nonfinite_steps (>= 0).
  NonFiniteGuard(const Transformer& model, const std::vector<LocalShard>& shards, int64_t skip_limit);

  /// Agrees over `world` (collective: every rank calls it once per step, after the loss and
  /// gradient-norm reductions and before clipping or the optimizer) whether step `step` may be
  /// applied. `loss` (mean per target token) and `grad_norm` are the reduced values; `shard_terms`
  /// are this rank's unreduced Σ g² per local shard (GradientSync::grad_sum_squares's `each`);
  /// `local_preempt` is this rank's pending signal (0 = none). On a non-finite step a second
  /// collective names the first parameter with a non-finite gradient shard on any rank.
  /// @throws NonFiniteError on every rank alike when the step is non-finite and more than
  ///         skip_limit steps in a row have been: what() names the step, the non-finite
  ///         value(s) and the parameter. @throws CommError from the collectives.
  StepCheck check(int64_t step, double loss, double grad_norm, const std::vector<double>& shard_terms,
                  Communicator& world, int local_preempt);

  /// Non-finite steps skipped in a row so far (0 after an applied step).
  int64_t skipped_in_a_row() const { return in_a_row_; }
  /// Non-finite steps skipped over the whole run (this process's lifetime).
  int64_t skipped_total() const { return total_; }

 private:
  std::vector<std::string> names_;  // the whole model's parameters in model order (the catalog)
  const std::vector<LocalShard>& shards_;
  std::unordered_map<const Parameter*, int64_t> index_of_;  // position in names_
  int64_t skip_limit_;
  int64_t in_a_row_ = 0, total_ = 0;
};

}  // namespace meshtrain
