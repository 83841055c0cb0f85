#pragma once
/// @file Learning-rate schedule: linear warmup, a constant stage, then decay (linear, sqrt or
/// cosine) down to lr · min_lr_factor — the warmup-stable-decay schedule of TorchTitan
/// (Hu et al. 2024, "MiniCPM", for WSD).
#include <cstdint>

#include "config/job_config.hpp"

namespace meshtrain {

class LrSchedule {
 public:
  /// Ranges were checked by config validation; warmup is capped at total_steps.
  LrSchedule(const LrSchedulerSection& cfg, double base_lr, int64_t total_steps);
  /// Learning rate for optimizer step `step` (1-based): warmup lr·s/(w+1) for s ≤ w; lr in the
  /// stable stage; in the last `decay_steps` steps, progress p = (s − w − stable − 1)/decay_steps
  /// (so the last step still trains, at lr·(min + (1−min)/decay_steps) for linear)
  /// and factor 1−p (linear), 1−√p (sqrt) or (1+cos πp)/2 (cosine), mapped to
  /// [min_lr_factor, 1].
  double lr(int64_t step) const;
  int64_t warmup_steps() const { return warmup_; }
  int64_t decay_steps() const { return decay_; }

 private:
  double base_;
  int64_t warmup_, decay_, stable_;
  std::string type_;
  double min_factor_;
};

}  // namespace meshtrain
