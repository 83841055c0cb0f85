#include "metrics/step_profiler.hpp"

#include <stdexcept>

#include "metrics/chrome_trace.hpp"
#include "util/trace.hpp"

namespace meshtrain {

StepProfiler::StepProfiler(ProfilingOptions opt, int rank) : opt_(std::move(opt)), rank_(rank) {
  if (!opt_.enable_profiling) return;
  auto bad = [](const std::string& key, int64_t v, const std::string& rule) {
    throw std::invalid_argument("[profiling] " + key + " = " + std::to_string(v) + ": " + rule);
  };
  if (opt_.profile_freq < 1) bad("profile_freq", opt_.profile_freq, "must be >= 1");
  if (opt_.profiler_active < 1) bad("profiler_active", opt_.profiler_active, "must be >= 1");
  if (opt_.profiler_warmup < 0) bad("profiler_warmup", opt_.profiler_warmup, "must be >= 0");
  if (opt_.profiler_warmup + opt_.profiler_active > opt_.profile_freq)
    bad("profiler_warmup", opt_.profiler_warmup,
        "profiler_warmup + profiler_active (" + std::to_string(opt_.profiler_active) +
            ") must be <= profile_freq (" + std::to_string(opt_.profile_freq) + ")");
}

StepProfiler::~StepProfiler() {
  if (started_) trace::enable(false);
}

int64_t StepProfiler::position(int64_t step) const {
  const int64_t p = (step - 1) % opt_.profile_freq;
  return p < 0 ? p + opt_.profile_freq : p;
}

bool StepProfiler::records(int64_t step) const {
  return opt_.enable_profiling && position(step) >= opt_.profile_freq - opt_.profiler_active;
}

bool StepProfiler::warms_up(int64_t step) const {
  if (!opt_.enable_profiling) return false;
  const int64_t p = position(step), first_active = opt_.profile_freq - opt_.profiler_active;
  return p < first_active && p >= first_active - opt_.profiler_warmup;
}

bool StepProfiler::writes_after(int64_t step) const {
  return opt_.enable_profiling && position(step) == opt_.profile_freq - 1;
}

void StepProfiler::begin_step(int64_t step) {
  if (!opt_.enable_profiling) return;
  const bool on = records(step) || warms_up(step);
  // The window's first traced step: drop the warm-up's events and anything left from before.
  if (records(step) && position(step) == opt_.profile_freq - opt_.profiler_active) trace::take();
  if (on != started_) trace::enable(on);
  started_ = on;
}

std::string StepProfiler::end_step(int64_t step) {
  if (!writes_after(step)) return {};
  trace::enable(false);
  started_ = false;
  return write_chrome_trace(opt_.save_traces_folder, step, rank_, trace::take());
}

}  // namespace meshtrain
