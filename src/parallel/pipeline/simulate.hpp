#pragma once
/// @file Unit-cost simulation of a pipeline schedule (schedule.hpp): each rank runs its list in
/// order; a compute action occupies the rank for its cost; a SEND completes at once (buffered,
/// non-blocking) and a RECV waits until its SEND has run. Used to prove a schedule free of
/// deadlock and to measure its bubble against the papers' formulas.
///
/// Cost model (time units per stage per micro-batch), chosen so the textbook figures are exact:
/// F = 1, fused B = 2, I = 1, W = 1, communication free. A rank's busy time is the sum of its
/// compute costs, its idle time is makespan − busy, and the bubble fraction is idle / busy,
/// the maximum over ranks (every generated schedule gives all ranks equal busy time). With these
/// costs (m micro-batches, pp ranks, v stages per rank):
///  - GPipe and 1F1B: (pp − 1) / m (Huang et al. 2019; Narayanan et al. 2021);
///  - Interleaved1F1B: (pp − 1) / (v·m) (Narayanan et al. 2021, Megatron-LM);
///  - InterleavedZeroBubble: ZB-H1's bubble time (pp − 1)(T_F + T_B − T_W) (Qi et al. 2024)
///    with T_F = T_I = T_W = 1, over v·m·3 busy units: (pp − 1) / (3·v·m). It is
///    also the lower bound of any schedule: the last rank cannot start before the first
///    micro-batch has crossed pp − 1 stages of F = 1 each;
///  - ZBVZeroBubble: the same warm-up bound, pp − 1 idle units over 2·m·3 busy ones:
///    (pp − 1) / (6·m). With T_F = T_I = T_W, ZB-V (Qi et al. 2024) fills every other bubble
///    with W passes; the tests check that the generator here reaches this bound.
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pipeline/schedule.hpp"

namespace meshtrain {

/// Time units each action takes (see the file comment).
struct UnitCosts {
  int64_t forward = 1;
  int64_t backward = 2;
  int64_t backward_input = 1;
  int64_t backward_weight = 1;
  int64_t communication = 0;  ///< added to a SEND's completion before its RECV may finish
};

/// What simulate_schedule() measured. All times are in the UnitCosts' units.
struct SimulationResult {
  int64_t makespan = 0;             ///< when the last rank finishes
  std::vector<int64_t> busy;        ///< [pp] compute time per rank
  std::vector<int64_t> idle;        ///< [pp] makespan − busy
  /// [pp] most (stage, micro-batch) forwards whose B (fused) or W (split backward: the weight
  /// gradient still reads the saved activations) has not run yet: the activation memory a rank
  /// holds, in stage micro-batches.
  std::vector<int> peak_in_flight;
  /// One moment of a rank, per stage of the rank (indexed like PipelineSchedule::stages_of(rank)):
  /// `held` micro-batches whose forward ran and whose backward (B, or I of a split one) has not,
  /// besides the one running; `pending` those between I and W (the weight gradient's operands);
  /// `running` the stage whose action runs: a forward, a backward (B, or I of a split one) or a
  /// W (that micro-batch still counted in `pending`); `backed` per stage whether its first
  /// backward (B or I) of the round has ended (pipelined FSDP keeps a stage's unsharded
  /// gradients from then until the step's last backward).
  struct InFlightState {
    enum class Phase { kForward, kBackward, kWeight };
    std::vector<int> held, pending;
    int running = 0;
    Phase phase = Phase::kForward;
    std::vector<char> backed;
    bool operator==(const InFlightState&) const = default;
  };
  /// [pp] the states a rank passes through at its compute actions (a forward after it counts
  /// its micro-batch, a backward before it releases one), only those no other state of the
  /// same running stage, phase and `backed` dominates (held and pending no larger for every
  /// stage): the activation memory of stages of different sizes peaks at one of them. Listed
  /// only when simulate_schedule() is asked to.
  std::vector<std::vector<InFlightState>> in_flight_states;
  /// [pp][actions of the rank] when each compute action starts and finishes; -1 for
  /// communication actions.
  std::vector<std::vector<int64_t>> start, finish;
  /// [pp][makespan] the compute action occupying each unit slot (to_string form), "" when idle
  /// (empty when simulate_schedule() was called with timeline = false).
  std::vector<std::vector<std::string>> timeline;

  /// max over ranks of idle / busy (0 for a rank with no work).
  double bubble_fraction() const;
};

/// A time per pipeline message (is gradient, stage, micro-batch), unset until put: a flat table
/// over `s`'s stages and micro-batches (the planner simulates schedules of 10^5 actions, where a
/// map per message cost most of the time), and a map for keys outside them (lists that
/// validate_schedule() would refuse can still be simulated). Times are ≥ 0.
class MessageTimes {
 public:
  explicit MessageTimes(const PipelineSchedule& s);
  /// Records `t` for the key (replacing an earlier one).
  void put(bool gradient, int stage, int microbatch, int64_t t);
  /// The recorded time, or −1 when none was put. Throws nothing.
  int64_t get(bool gradient, int stage, int microbatch) const;

 private:
  int64_t* slot(bool gradient, int stage, int microbatch);
  const int64_t* slot(bool gradient, int stage, int microbatch) const;
  int stages_ = 0, microbatches_ = 0;
  std::vector<int64_t> flat_;
  std::map<std::tuple<bool, int, int>, int64_t> other_;
};

/// Runs `s` under `costs`. Does not check data dependencies (validate_schedule() does); it only
/// needs each RECV's SEND to exist somewhere to make progress.
/// @throws ScheduleError on deadlock — no rank can run its next action while some list is
///         unfinished — naming every blocked rank and the action it waits at.
/// `in_flight_states`: also list SimulationResult::in_flight_states (the planner's memory model
/// needs them; they cost a dominance check per compute action), else those lists stay empty.
/// `timeline`: also fill SimulationResult::timeline (one string per rank and unit slot, what
/// format_timeline prints); callers that only need times, verdicts or states pass false (the
/// planner simulates schedules of 10^5 actions), and timeline stays empty.
SimulationResult simulate_schedule(const PipelineSchedule& s, const UnitCosts& costs = {}, bool in_flight_states = false,
                                   bool timeline = true);

/// A schedule's bubble fraction from the papers, for the unit costs above.
struct BubbleFormula {
  std::string text;  ///< e.g. "(pp - 1) / m"
  double value = 0;
};

/// The papers' bubble fraction for `s` (see the file comment for each schedule's source).
/// @throws ScheduleError for a schedule name without a formula ("csv").
BubbleFormula textbook_bubble(const PipelineSchedule& s);

/// The timeline as text: a header of slot numbers, then one row per rank with one column per
/// unit slot, "." for idle.
std::string format_timeline(const SimulationResult& r);

}  // namespace meshtrain
