#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace meshtrain {

LrSchedule::LrSchedule(const LrSchedulerSection& cfg, double base_lr, int64_t total_steps)
    : base_(base_lr), type_(cfg.decay_type), min_factor_(cfg.min_lr_factor) {
  warmup_ = std::min(cfg.warmup_steps, total_steps);
  const int64_t rest = total_steps - warmup_;
  decay_ = cfg.decay_ratio ? std::min<int64_t>(rest, std::llround(double(total_steps) * *cfg.decay_ratio)) : rest;
  stable_ = rest - decay_;
}

double LrSchedule::lr(int64_t step) const {
  double f = 1.0;
  if (step <= warmup_) {
    f = double(step) / double(warmup_ + 1);
  } else if (step > warmup_ + stable_ && decay_ > 0) {
    const double p = std::clamp(double(step - warmup_ - stable_ - 1) / double(decay_), 0.0, 1.0);
    double d = 1.0 - p;
    if (type_ == "sqrt") d = 1.0 - std::sqrt(p);
    if (type_ == "cosine") d = 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    f = min_factor_ + (1.0 - min_factor_) * d;
  }
  return base_ * f;
}

}  // namespace meshtrain
