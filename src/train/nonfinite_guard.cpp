#include "train/nonfinite_guard.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "model/parameter_catalog.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

std::string num(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

NonFiniteGuard::NonFiniteGuard(const Transformer& model, const std::vector<LocalShard>& shards, int64_t skip_limit)
    : shards_(shards), skip_limit_(skip_limit) {
  // World-wide indices: under pipeline parallelism each rank holds some of the parameters only.
  const ParameterCatalog catalog(model.args(), model.tensor_parallel());
  for (const CatalogEntry& e : catalog.entries()) names_.push_back(e.meta.name);
  for (Parameter* p : model.parameters()) index_of_.emplace(p, catalog.index_of(p->name));
}

StepCheck NonFiniteGuard::check(int64_t step, double loss, double grad_norm, const std::vector<double>& shard_terms,
                                Communicator& world, int local_preempt) {
  const bool loss_ok = std::isfinite(loss), norm_ok = std::isfinite(grad_norm);
  // One agreement per step: any rank's non-finite verdict, and any rank's pending signal.
  double flags[2] = {loss_ok && norm_ok ? 0.0 : 1.0, double(local_preempt)};
  world.all_reduce_host(flags, 2, ReduceOp::kMax);
  StepCheck out;
  out.preempt_signal = int(flags[1]);
  if (flags[0] == 0) {
    in_a_row_ = 0;
    return out;
  }

  // Failure path only: the first parameter (model order) whose gradient shard is non-finite on
  // some rank, and the lowest rank that saw a non-finite loss or norm itself.
  const double none = std::numeric_limits<double>::max();
  double first[2] = {none, loss_ok && norm_ok ? none : double(world.rank())};
  for (size_t i = 0; i < shards_.size() && i < shard_terms.size(); ++i)
    if (!std::isfinite(shard_terms[i])) {
      const auto it = index_of_.find(shards_[i].param);
      if (it != index_of_.end()) first[0] = std::min(first[0], double(it->second));
    }
  world.all_reduce_host(first, 2, ReduceOp::kMin);

  std::string what = "step " + std::to_string(step) + ": ";
  if (!loss_ok && !norm_ok) what += "loss " + num(loss) + " and gradient norm " + num(grad_norm) + " are non-finite";
  else if (!loss_ok) what += "loss " + num(loss) + " is non-finite (gradient norm " + num(grad_norm) + ")";
  else if (!norm_ok) what += "gradient norm " + num(grad_norm) + " is non-finite (loss " + num(loss) + ")";
  else what += "rank " + num(first[1]) + " computed a non-finite loss or gradient norm that the reductions did not show";
  if (first[0] != none)
    what += "; first parameter with a non-finite gradient: " + names_[size_t(first[0])];
  else
    what += "; every gradient is finite (the loss itself overflowed)";

  ++total_;
  if (++in_a_row_ <= skip_limit_) {
    out.verdict = StepVerdict::kSkip;
    out.message = what + "; the update was skipped (" + std::to_string(in_a_row_) + " of at most " +
                  std::to_string(skip_limit_) + " in a row, [training] skip_nonfinite_steps)";
    return out;
  }
  throw NonFiniteError(what + "; the update was not applied and nothing was saved after it (" +
                       (skip_limit_ > 0 ? std::to_string(in_a_row_) + " non-finite steps in a row, [training] "
                                                                       "skip_nonfinite_steps = " +
                                              std::to_string(skip_limit_)
                                        : std::string("[training] skip_nonfinite_steps = 0")) +
                       ")");
}

}  // namespace meshtrain
