#include "parallel/pipeline/simulate.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace meshtrain {

namespace {

int64_t cost_of(const Action& a, const UnitCosts& c) {
  switch (a.type) {
    case ActionType::kForward: return c.forward;
    case ActionType::kBackward: return c.backward;
    case ActionType::kBackwardInput: return c.backward_input;
    case ActionType::kBackwardWeight: return c.backward_weight;
    default: return 0;
  }
}

}  // namespace

MessageTimes::MessageTimes(const PipelineSchedule& s) : stages_(s.num_stages()), microbatches_(s.microbatches) {
  if (stages_ > 0 && microbatches_ > 0) flat_.assign(size_t(2) * size_t(stages_) * size_t(microbatches_), -1);
}

const int64_t* MessageTimes::slot(bool gradient, int stage, int microbatch) const {
  if (flat_.empty() || stage < 0 || stage >= stages_ || microbatch < 0 || microbatch >= microbatches_) return nullptr;
  return &flat_[(size_t(gradient) * size_t(stages_) + size_t(stage)) * size_t(microbatches_) + size_t(microbatch)];
}

int64_t* MessageTimes::slot(bool gradient, int stage, int microbatch) {
  return const_cast<int64_t*>(std::as_const(*this).slot(gradient, stage, microbatch));
}

void MessageTimes::put(bool gradient, int stage, int microbatch, int64_t t) {
  if (int64_t* p = slot(gradient, stage, microbatch)) *p = t;
  else other_[{gradient, stage, microbatch}] = t;
}

int64_t MessageTimes::get(bool gradient, int stage, int microbatch) const {
  if (const int64_t* p = slot(gradient, stage, microbatch)) return *p;
  const auto it = other_.find({gradient, stage, microbatch});
  return it == other_.end() ? -1 : it->second;
}

double SimulationResult::bubble_fraction() const {
  double worst = 0;
  for (size_t r = 0; r < busy.size(); ++r)
    if (busy[r] > 0) worst = std::max(worst, static_cast<double>(idle[r]) / static_cast<double>(busy[r]));
  return worst;
}

SimulationResult simulate_schedule(const PipelineSchedule& s, const UnitCosts& costs, bool in_flight_states,
                                   bool timeline) {
  const int P = static_cast<int>(s.ranks.size());
  std::vector<size_t> pos(P, 0);
  std::vector<int64_t> now(P, 0);
  std::vector<int> in_flight(P, 0);
  SimulationResult out;
  out.busy.assign(P, 0);
  out.peak_in_flight.assign(P, 0);
  out.in_flight_states.resize(P);
  std::vector<std::vector<int>> local(P);       // [rank][global stage] → index in stages_of(rank), −1
  // [rank][local stage] micro-batches whose forward ran and whose backward (B or I) has not:
  // they keep their saved activations; and those between I and W: they keep the weight
  // gradient's operands.
  std::vector<std::vector<int>> awaiting(P), pending(P);
  std::vector<std::vector<char>> backed(P);  // [rank][local stage] its first backward has ended
  for (int r = 0; r < P; ++r) {
    const std::vector<int> mine = s.stages_of(r);
    awaiting[r].assign(mine.size(), 0);
    pending[r].assign(mine.size(), 0);
    backed[r].assign(mine.size(), 0);
    for (size_t i = 0; i < mine.size(); ++i) {
      if (int(local[r].size()) <= mine[i]) local[r].resize(size_t(mine[i]) + 1, -1);
      local[r][size_t(mine[i])] = int(i);
    }
  }
  // Records rank r's state with a micro-batch of local stage `run` running its forward or
  // backward (not counted in `held`), or its W (its operands stay counted in `pending` until it
  // ends), keeping only the states no other one of the same kind dominates.
  using Phase = SimulationResult::InFlightState::Phase;
  struct Recorded {
    size_t order;  // when it was recorded
    SimulationResult::InFlightState state;
  };
  std::vector<std::vector<std::vector<Recorded>>> kinds(P);  // [rank][local stage · 3 + phase]
  for (int r = 0; r < P; ++r) kinds[r].resize(awaiting[r].size() * 3);
  size_t recorded = 0;
  auto record = [&](int r, int run, Phase phase) {
    auto covers = [](const SimulationResult::InFlightState& x, const SimulationResult::InFlightState& y) {
      if (x.running != y.running || x.phase != y.phase || x.backed != y.backed) return false;
      for (size_t i = 0; i < x.held.size(); ++i)
        if (x.held[i] < y.held[i] || x.pending[i] < y.pending[i]) return false;
      return true;
    };
    // Most states are dominated by one already listed: test that before copying the counters
    // (the planner simulates schedules of 10^5 actions).
    const std::vector<int>& held = awaiting[r];
    const int less = phase != Phase::kWeight ? 1 : 0;  // the running micro-batch is not held
    // Only states of the same running stage and phase can dominate: each (stage, phase) keeps
    // its own list (with each state's record order, to list them in that order at the end).
    std::vector<Recorded>& same = kinds[r][size_t(run) * 3 + size_t(phase)];
    for (const Recorded& rec : same) {
      const SimulationResult::InFlightState& e = rec.state;
      if (e.backed != backed[r]) continue;
      bool all = true;
      for (size_t i = 0; i < e.held.size() && all; ++i)
        all = e.held[i] >= held[i] - (i == size_t(run) ? less : 0) && e.pending[i] >= pending[r][i];
      if (all) return;
    }
    SimulationResult::InFlightState st{awaiting[r], pending[r], run, phase, backed[r]};
    if (phase != Phase::kWeight) --st.held[size_t(run)];
    std::erase_if(same, [&](const Recorded& e) { return covers(st, e.state); });
    same.push_back({recorded++, std::move(st)});
  };
  out.start.resize(P);
  out.finish.resize(P);
  for (int r = 0; r < P; ++r) {
    out.start[r].assign(s.ranks[r].size(), -1);
    out.finish[r].assign(s.ranks[r].size(), -1);
  }
  // (is gradient, sending stage, mb) → time the message is available to its receiver
  MessageTimes arrived(s);
  struct Slot {
    int64_t start, length;
    std::string label;
  };
  std::vector<std::vector<Slot>> slots(P);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      for (; pos[r] < s.ranks[r].size(); ++pos[r]) {
        const Action& a = s.ranks[r][pos[r]];
        if (a.type == ActionType::kRecvActivation || a.type == ActionType::kRecvGradient) {
          const bool grad = a.type == ActionType::kRecvGradient;
          const int from = grad ? a.stage + 1 : a.stage - 1;
          const int64_t t = arrived.get(grad, from, a.microbatch);
          if (t < 0) break;
          now[r] = std::max(now[r], t);
        } else if (a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient) {
          arrived.put(a.type == ActionType::kSendGradient, a.stage, a.microbatch, now[r] + costs.communication);
        } else {
          const int64_t c = cost_of(a, costs);
          if (timeline) slots[r].push_back({now[r], c, to_string(a)});
          out.start[r][pos[r]] = now[r];
          now[r] += c;
          out.finish[r][pos[r]] = now[r];
          out.busy[r] += c;
          const int ls = a.stage >= 0 && a.stage < int(local[r].size()) ? local[r][size_t(a.stage)] : -1;
          if (a.type == ActionType::kForward) {
            out.peak_in_flight[r] = std::max(out.peak_in_flight[r], ++in_flight[r]);
            if (ls >= 0) ++awaiting[r][size_t(ls)];
          }
          // A forward counts its micro-batch from its start, a backward until its end.
          const Phase phase = a.type == ActionType::kForward          ? Phase::kForward
                              : a.type == ActionType::kBackwardWeight ? Phase::kWeight
                                                                      : Phase::kBackward;
          if (in_flight_states && ls >= 0 &&
              (phase == Phase::kWeight ? pending[r][size_t(ls)] > 0 : awaiting[r][size_t(ls)] > 0)) {
            record(r, ls, phase);
          }
          if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardWeight) --in_flight[r];
          if (ls >= 0) {
            if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) {
              --awaiting[r][size_t(ls)];
              backed[r][size_t(ls)] = 1;
            }
            if (a.type == ActionType::kBackwardInput) ++pending[r][size_t(ls)];
            if (a.type == ActionType::kBackwardWeight) --pending[r][size_t(ls)];
          }
        }
        progress = true;
      }
    }
  }
  // Each rank's surviving states in the order they were recorded.
  for (int r = 0; r < P && in_flight_states; ++r) {
    std::vector<Recorded> all;
    for (std::vector<Recorded>& k : kinds[r])
      for (Recorded& rec : k) all.push_back(std::move(rec));
    std::sort(all.begin(), all.end(), [](const Recorded& x, const Recorded& y) { return x.order < y.order; });
    for (Recorded& rec : all) out.in_flight_states[r].push_back(std::move(rec.state));
  }
  std::string blocked;
  for (int r = 0; r < P; ++r)
    if (pos[r] < s.ranks[r].size())
      blocked += (blocked.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits at action " +
                 std::to_string(pos[r]) + " " + to_string(s.ranks[r][pos[r]]);
  if (!blocked.empty()) throw ScheduleError("schedule " + s.name + " deadlocks: " + blocked);
  out.makespan = P ? *std::max_element(now.begin(), now.end()) : 0;
  out.idle.resize(P);
  if (timeline) out.timeline.assign(P, std::vector<std::string>(out.makespan));
  for (int r = 0; r < P; ++r) {
    out.idle[r] = out.makespan - out.busy[r];
    for (const Slot& sl : slots[r])
      for (int64_t t = sl.start; t < sl.start + sl.length; ++t) out.timeline[r][t] = sl.label;
  }
  return out;
}

BubbleFormula textbook_bubble(const PipelineSchedule& s) {
  const double p = s.pp, m = s.microbatches, v = s.stages_per_rank;
  if (s.name == "GPipe" || s.name == "1F1B") return {"formula (pp - 1) / m", (p - 1) / m};
  if (s.name == "Interleaved1F1B") return {"formula (pp - 1) / (v * m)", (p - 1) / (v * m)};
  if (s.name == "InterleavedZeroBubble") return {"ZB-H1 (pp - 1) / (3 * v * m)", (p - 1) / (3 * v * m)};
  if (s.name == "ZBVZeroBubble") return {"ZB-V (pp - 1) / (6 * m)", (p - 1) / (6 * m)};
  throw ScheduleError("schedule " + s.name + " has no textbook bubble formula");
}

std::string format_timeline(const SimulationResult& r) {
  size_t width = 2;
  for (const auto& row : r.timeline)
    for (const auto& cell : row) width = std::max(width, cell.size());
  auto pad = [width](std::string s) {
    s.resize(width, ' ');
    return s + ' ';
  };
  std::string out = "slot    ";
  for (int64_t t = 0; t < r.makespan; ++t) out += pad(std::to_string(t));
  out += '\n';
  for (size_t rank = 0; rank < r.timeline.size(); ++rank) {
    std::string head = "rank " + std::to_string(rank);
    head.resize(8, ' ');
    out += head;
    for (const auto& cell : r.timeline[rank]) out += pad(cell.empty() ? "." : cell);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  }
  return out;
}

}  // namespace meshtrain
