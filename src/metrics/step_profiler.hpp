#pragma once
/// @file StepProfiler: which training steps are traced ([profiling] profile_freq,
/// profiler_warmup, profiler_active) and the Chrome trace written after each traced window
/// (metrics/chrome_trace.hpp). The schedule is torch.profiler.schedule(wait = profile_freq −
/// warmup − active, warmup, active) as TorchTitan drives it (its profiler's step number is the
/// number of completed steps), which makes it a function of the absolute step, the same after a
/// resume:
///  - step s (1-based) is recorded when s mod profile_freq is one of the last `active` positions
///    of its window: ((s − 1) mod profile_freq) ≥ profile_freq − active;
///  - the `warmup` steps before those are recorded too and the events discarded when the window
///    starts (torch's warm-up; here it keeps the recorder's one-time costs out of the window);
///  - after step s with s mod profile_freq == 0 the window's events are written to
///    `<folder>/iteration_<s>/rank<R>_trace.json`.
///
/// Use from the step loop (every rank):
///
///     StepProfiler prof(opts, rank);
///     for (step ...) {
///       prof.begin_step(step);
///       { trace::Span s("step", "step"); s.arg("step", step); ... }   // whole-step span
///       prof.end_step(step);                                          // may write a file
///     }
#include <cstdint>
#include <string>

namespace meshtrain {

/// The [profiling] keys (TorchTitan's names).
struct ProfilingOptions {
  bool enable_profiling = false;
  std::string save_traces_folder;  ///< resolved path (the trainer joins it to dump_folder)
  int64_t profile_freq = 10;
  int64_t profiler_warmup = 3;
  int64_t profiler_active = 1;
};

class StepProfiler {
 public:
  /// @throws std::invalid_argument naming the [profiling] key when enable_profiling is set and
  /// profile_freq < 1, profiler_active < 1, profiler_warmup < 0 or profiler_warmup +
  /// profiler_active > profile_freq.
  StepProfiler(ProfilingOptions opt, int rank);
  /// Stops recording if this profiler started it.
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Whether step `step` (1-based) is inside a traced window (false when profiling is off).
  bool records(int64_t step) const;
  /// Whether step `step` is a warm-up step (recorded, then discarded).
  bool warms_up(int64_t step) const;
  /// Whether the trace file is written after step `step` (the window's last step).
  bool writes_after(int64_t step) const;

  /// Before the step's work: turns recording on for warm-up and traced steps (dropping the
  /// warm-up's events when the window starts) and off otherwise.
  void begin_step(int64_t step);
  /// After the step's work: when writes_after(step), stops recording and writes the window's
  /// events. Returns the file written, or "" when none was.
  /// @throws std::runtime_error naming the file when it cannot be written.
  std::string end_step(int64_t step);

 private:
  int64_t position(int64_t step) const;  // (step − 1) mod profile_freq, in [0, profile_freq)
  ProfilingOptions opt_;
  int rank_;
  bool started_ = false;  // this profiler turned recording on
};

}  // namespace meshtrain
