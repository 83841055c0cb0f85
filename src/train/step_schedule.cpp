#include "train/step_schedule.hpp"

#include <limits>

namespace meshtrain {

AccumulationSchedule::AccumulationSchedule(Transformer& model, Executor& exec, GradientSync& sync, const DataLoader& loader,
                                           const ParallelContext& pc, int64_t local_batch, int64_t seq_len, int64_t accum,
                                           float loss_grad_scale, std::function<bool(int64_t)> poisoned)
    : model_(model),
      exec_(exec),
      sync_(sync),
      loader_(loader),
      pc_(pc),
      local_batch_(local_batch),
      seq_len_(seq_len),
      accum_(accum),
      loss_grad_scale_(loss_grad_scale),
      poisoned_(std::move(poisoned)),
      samples_(size_t(local_batch * (seq_len + 1))) {}

double AccumulationSchedule::run(int64_t step) {
  double loss_sum = 0;
  for (int64_t m = 0; m < accum_; ++m) {
    loader_.micro_batch(m, pc_.data->rank(), pc_.data->size(), local_batch_, samples_.data());
    const bool poison = m + 1 == accum_ && poisoned_ && poisoned_(step);
    const float scale = poison ? std::numeric_limits<float>::quiet_NaN() : loss_grad_scale_;
    StepContext ctx = model_.make_context(samples_.data(), local_batch_, seq_len_, scale, /*need_backward=*/true);
    sync_.begin_micro_batch(m, accum_);
    exec_.forward_backward(ctx);
    loss_sum += ctx.loss_sum;
  }
  return loss_sum;
}

EvalSums AccumulationSchedule::evaluate(const int32_t* samples, int64_t n) {
  StepContext ctx = model_.make_context(samples, n, seq_len_, 0.0f, /*need_backward=*/false);
  exec_.forward_only(ctx);
  return {ctx.loss_sum, ctx.num_targets};
}

std::string AccumulationSchedule::describe() const {
  return "gradient accumulation, " + std::to_string(accum_) + " micro-batch" + (accum_ == 1 ? "" : "es") + " per step";
}

}  // namespace meshtrain
