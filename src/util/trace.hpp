#pragma once
/// @file Process-wide span recorder for per-step timing traces ([profiling], written as Chrome
/// trace JSON by metrics/chrome_trace.hpp). Off by default: every recording site first does one
/// relaxed atomic load (`enabled()`) and nothing else, so the instrumentation in the executor,
/// the collectives and the data-parallel strategies costs nothing outside profiled steps.
///
/// Two kinds of event:
///  - complete spans (`Span`, RAII): a name, a category, the calling thread, a start and a
///    duration. Spans of one thread nest by construction (destructors run in reverse order), which
///    is what the Trace Event Format requires of "X" events on one thread;
///  - async spans (`record_async`): intervals that do not nest with the calling thread's spans,
///    e.g. a non-blocking collective from its issue to its first observed completion.
///
/// Timestamps are nanoseconds of std::chrono::steady_clock since this process's origin (the first
/// use of the recorder); `origin_unix_us()` is the system clock at that origin, so traces of
/// different ranks can be aligned to the precision of the nodes' clock synchronization.
///
/// Thread safety: every function may be called from any thread (a collective may complete on a
/// watchdog thread). Record spans only from threads meshtrain created or the calling thread, never
/// inside an OpenMP parallel region (the CPU device's kernels): one span per OpenMP worker per
/// kernel would flood the trace and measure nothing the enclosing span does not.
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace meshtrain::trace {

/// A value of an event's "args" (shown in the viewer's details pane).
using ArgValue = std::variant<int64_t, double, std::string>;

/// One recorded interval.
struct Event {
  enum class Phase { kComplete, kAsync };
  Phase phase = Phase::kComplete;
  std::string name;      ///< e.g. the unit ("layers.3") or the collective ("all_gather")
  std::string category;  ///< e.g. "forward", "backward", "recompute", "collective", "comm_wait"
  int64_t start_ns = 0;     ///< since the process origin (steady clock), nanoseconds
  int64_t duration_ns = 0;  ///< nanoseconds, >= 0
  int64_t tid = 0;          ///< the recording thread's OS thread id (gettid)
  uint64_t id = 0;          ///< kAsync only: unique within the process, pairs begin and end
  std::vector<std::pair<std::string, ArgValue>> args;
};

/// What take() hands over: the events recorded since the last take(), in the order they ended,
/// and a name for every thread that appears in them.
struct Recording {
  std::vector<Event> events;
  std::map<int64_t, std::string> thread_names;  ///< tid -> "main", "thread 1234", or set_thread_name()
  int64_t dropped = 0;  ///< events not kept because kMaxEvents were already pending
};

/// Events kept between two take() calls; later ones are counted in Recording::dropped (a guard
/// against a caller that enables tracing and never takes: 2^20 events are ~200 MB at most).
inline constexpr size_t kMaxEvents = size_t(1) << 20;

namespace detail {
extern std::atomic<bool> g_enabled;
}

/// Starts (true) or stops (false) recording in every thread. Spans already open when recording
/// stops are still recorded when they end, so a trace never holds a parent without its children.
void enable(bool on);
/// Whether recording is on: one relaxed atomic load.
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

/// Nanoseconds since the process origin on the steady clock.
int64_t now_ns();
/// The system clock at the process origin, microseconds since the Unix epoch.
int64_t origin_unix_us();
/// Names the calling thread in traces (default: "main" for the process's first thread, else
/// "thread <tid>").
void set_thread_name(const std::string& name);

/// Records an async interval [start_ns, end_ns] of the calling thread (e.g. a collective from
/// issue to completion). Does nothing when recording is off. end_ns < start_ns is clamped to a
/// zero duration.
void record_async(std::string_view name, std::string_view category, int64_t start_ns, int64_t end_ns,
                  std::vector<std::pair<std::string, ArgValue>> args = {});

/// Returns the events recorded so far and forgets them (the thread names are kept).
Recording take();

/// RAII complete span: from construction to destruction on the calling thread. When recording is
/// off at construction it does nothing at all (no allocation, no clock read), whatever happens
/// afterwards.
///
///     trace::Span span(unit.name(), "forward");
///     span.arg("bytes", int64_t(t.nbytes())).arg("group", comm.name());
class Span {
 public:
  Span(std::string_view name, std::string_view category) {
    if (enabled()) begin(name, category);
  }
  ~Span() {
    if (ev_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  /// Adds a key/value to the span's args (ignored when the span is inactive).
  template <class T>
    requires std::is_integral_v<T>
  Span& arg(std::string_view key, T value) {
    return add(key, ArgValue(int64_t(value)));
  }
  Span& arg(std::string_view key, double value) { return add(key, ArgValue(value)); }
  Span& arg(std::string_view key, std::string_view value) { return add(key, ArgValue(std::string(value))); }
  /// Whether this span records (recording was on when it was constructed).
  bool active() const { return ev_.has_value(); }

 private:
  void begin(std::string_view name, std::string_view category);
  void end();
  Span& add(std::string_view key, ArgValue value) {
    if (ev_) ev_->args.emplace_back(std::string(key), std::move(value));
    return *this;
  }
  std::optional<Event> ev_;
};

}  // namespace meshtrain::trace
