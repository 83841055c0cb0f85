#include "util/trace.hpp"

#include <unistd.h>

#include <chrono>
#include <mutex>

namespace meshtrain::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

struct Origin {
  std::chrono::steady_clock::time_point steady;
  int64_t unix_us;
};

const Origin& origin() {
  static const Origin o{std::chrono::steady_clock::now(),
                        std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count()};
  return o;
}

// gettid() is a system call: cache it per thread.
int64_t this_tid() {
  thread_local const int64_t tid = int64_t(::gettid());
  return tid;
}

struct Store {
  std::mutex mu;
  std::vector<Event> events;
  std::map<int64_t, std::string> names;
  int64_t dropped = 0;
  std::atomic<uint64_t> next_async_id{1};
};

Store& store() {
  static Store s;
  return s;
}

void push(Event&& e) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.names.count(e.tid))
    s.names[e.tid] = e.tid == int64_t(::getpid()) ? std::string("main") : "thread " + std::to_string(e.tid);
  if (s.events.size() >= kMaxEvents) {
    ++s.dropped;
    return;
  }
  s.events.push_back(std::move(e));
}

}  // namespace

void enable(bool on) {
  origin();  // fix the origin before the first span, not inside it
  detail::g_enabled.store(on, std::memory_order_relaxed);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin().steady)
      .count();
}

int64_t origin_unix_us() { return origin().unix_us; }

void set_thread_name(const std::string& name) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  s.names[this_tid()] = name;
}

void record_async(std::string_view name, std::string_view category, int64_t start_ns, int64_t end_ns,
                  std::vector<std::pair<std::string, ArgValue>> args) {
  if (!enabled()) return;
  Event e;
  e.phase = Event::Phase::kAsync;
  e.name = name;
  e.category = category;
  e.start_ns = start_ns;
  e.duration_ns = end_ns > start_ns ? end_ns - start_ns : 0;
  e.tid = this_tid();
  e.id = store().next_async_id.fetch_add(1, std::memory_order_relaxed);
  e.args = std::move(args);
  push(std::move(e));
}

Recording take() {
  Store& s = store();
  Recording r;
  std::lock_guard<std::mutex> lock(s.mu);
  r.events.swap(s.events);
  r.dropped = s.dropped;
  s.dropped = 0;
  for (const Event& e : r.events) r.thread_names.emplace(e.tid, s.names.at(e.tid));
  return r;
}

void Span::begin(std::string_view name, std::string_view category) {
  ev_.emplace();
  ev_->name = name;
  ev_->category = category;
  ev_->tid = this_tid();
  ev_->start_ns = now_ns();  // last: the span measures the caller's work, not its own set-up
}

void Span::end() {
  ev_->duration_ns = now_ns() - ev_->start_ns;
  push(std::move(*ev_));
  ev_.reset();
}

}  // namespace meshtrain::trace
