#pragma once
/// @file Timing of the cp group's transfers (CpStats), shared by the ring / all-gather and the
/// Ulysses attention: InFlight holds transfers that overlap block computation; wait_now is a
/// collective with nothing to overlap, all of it exposed.
#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/context/context_parallel.hpp"

namespace meshtrain::cp_detail {

/// Transfers posted together and overlapped with block computation. poll() between blocks
/// drives MPI's progress (a rendezvous transfer moves only inside MPI calls) and notes when they
/// completed; finish() waits and adds their span and the wait to the cp group's statistics.
/// Throws what Work::wait / test throw (CommError).
class InFlight {
 public:
  using Clock = std::chrono::steady_clock;
  InFlight() = default;
  explicit InFlight(std::vector<std::unique_ptr<Work>> works) : works_(std::move(works)), posted_(Clock::now()) {}
  void poll() {
    if (works_.empty() || done_) return;
    for (auto& w : works_)
      if (!w->test()) return;
    done_ = true;
    completed_ = Clock::now();
  }
  void finish(CpStats* stats) {
    if (works_.empty()) return;
    const auto t0 = Clock::now();
    for (auto& w : works_) w->wait();
    const auto t1 = Clock::now();
    if (stats) {
      stats->wait_s += seconds(t0, t1);
      stats->comm_s += seconds(posted_, done_ ? completed_ : t1);
    }
    works_.clear();
    done_ = false;
  }

 private:
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  std::vector<std::unique_ptr<Work>> works_;
  Clock::time_point posted_, completed_;
  bool done_ = false;
};

/// Waits for a collective posted just now (nothing to overlap it with): all of it is exposed.
inline void wait_now(std::unique_ptr<Work> work, CpStats* stats) {
  std::vector<std::unique_ptr<Work>> w;
  w.push_back(std::move(work));
  InFlight(std::move(w)).finish(stats);
}

}  // namespace meshtrain::cp_detail
