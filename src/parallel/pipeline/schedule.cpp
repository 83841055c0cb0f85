#include "parallel/pipeline/schedule.hpp"

#include <algorithm>
#include <charconv>
#include <deque>
#include <limits>
#include <map>
#include <tuple>

#include "parallel/pipeline/simulate.hpp"
#include "parallel/pipeline/stream_order.hpp"

namespace meshtrain {

namespace {

const char* kScheduleKey = "[parallelism] pipeline_parallel_schedule";
const char* kMicrobatchKey = "[parallelism] pipeline_parallel_microbatch_size";

const char* type_code(ActionType t) {
  switch (t) {
    case ActionType::kForward: return "F";
    case ActionType::kBackward: return "B";
    case ActionType::kBackwardInput: return "I";
    case ActionType::kBackwardWeight: return "W";
    case ActionType::kSendActivation: return "SEND_F";
    case ActionType::kRecvActivation: return "RECV_F";
    case ActionType::kSendGradient: return "SEND_B";
    case ActionType::kRecvGradient: return "RECV_B";
  }
  return "?";
}

std::string schedule_list() {
  std::string s;
  for (const auto& n : schedule_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

/// Megatron-LM's interleaved order (Narayanan et al. 2021): the k-th forward (backward) of a
/// rank runs chunk (k / pp) mod v (reversed for backwards) on micro-batch
/// (k / (pp·v))·pp + k mod pp, i.e. pp micro-batches per chunk before moving to the next chunk.
Action interleaved_action(const PipelineSchedule& s, int rank, int k, bool backward, ActionType type) {
  const int p = s.pp, v = s.stages_per_rank;
  int chunk = (k / p) % v;
  if (backward) chunk = v - 1 - chunk;
  const int mb = (k / (p * v)) * p + k % p;
  return {type, chunk * p + rank, mb};
}

/// Warm-up forwards of rank r before its first backward: pp − 1 − r for 1F1B, Megatron's
/// (pp − r − 1)·2 + (v − 1)·pp interleaved; never more than the v·m forwards there are.
int warmup_forwards(const PipelineSchedule& s, int rank) {
  const int total = s.stages_per_rank * s.microbatches;
  const int w = s.stages_per_rank == 1 ? s.pp - 1 - rank
                                       : (s.pp - rank - 1) * 2 + (s.stages_per_rank - 1) * s.pp;
  return std::min(w, total);
}

void gpipe(PipelineSchedule& s) {
  for (int r = 0; r < s.pp; ++r) {
    for (int mb = 0; mb < s.microbatches; ++mb) s.ranks[r].push_back({ActionType::kForward, r, mb});
    for (int mb = 0; mb < s.microbatches; ++mb) s.ranks[r].push_back({ActionType::kBackward, r, mb});
  }
}

/// 1F1B and Interleaved1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards.
void one_f_one_b(PipelineSchedule& s) {
  const int total = s.stages_per_rank * s.microbatches;
  for (int r = 0; r < s.pp; ++r) {
    auto& list = s.ranks[r];
    const int w = warmup_forwards(s, r);
    for (int k = 0; k < w; ++k) list.push_back(interleaved_action(s, r, k, false, ActionType::kForward));
    for (int k = 0; k + w < total; ++k) {
      list.push_back(interleaved_action(s, r, k + w, false, ActionType::kForward));
      list.push_back(interleaved_action(s, r, k, true, ActionType::kBackward));
    }
    for (int k = std::max(total - w, 0); k < total; ++k)
      list.push_back(interleaved_action(s, r, k, true, ActionType::kBackward));
  }
}

/// Zero-bubble list scheduling (Qi et al. 2024): F, I and W each take one unit slot; at every
/// slot each rank runs, in this priority, the first ready I of its backward order (I is on the
/// critical path), else the first ready F of its forward order while fewer than `limit[r]`
/// forwards await their W (the activation-memory cap: W still reads the saved inputs and output
/// gradients, so a micro-batch's activations live until its W), else its oldest pending W (W
/// fills what would be a bubble, or frees memory for the next F). Ready means the producing
/// action finished in an earlier slot.
/// `in_order`: take F and I strictly in list order (only the first not yet run may start);
/// interleaved loop placement needs it, as running a later chunk's forward early can fill the
/// in-flight cap with forwards whose backwards wait on ones not yet started (a deadlock).
void zero_bubble(PipelineSchedule& s, const std::vector<std::vector<Action>>& fwd,
                 const std::vector<std::vector<Action>>& bwd, const std::vector<int>& limit, bool in_order) {
  const int S = s.num_stages(), M = s.microbatches;
  constexpr long kNever = std::numeric_limits<long>::max();
  std::vector<long> f_end(S * M, kNever), i_end(S * M, kNever);
  auto at = [M](int stage, int mb) { return stage * M + mb; };
  // The first not-yet-taken index of each rank's orders: the scans below start there (the
  // taken prefix only grows), which keeps a pp 64 schedule of 10^5 actions from being quadratic.
  std::vector<size_t> f_first(s.pp, 0), i_first(s.pp, 0);
  std::vector<std::vector<bool>> f_taken(s.pp), i_taken(s.pp);
  std::vector<std::deque<Action>> pending_w(s.pp);
  std::vector<int> in_flight(s.pp, 0);
  for (int r = 0; r < s.pp; ++r) {
    f_taken[r].assign(fwd[r].size(), false);
    i_taken[r].assign(bwd[r].size(), false);
  }
  const long total = 3L * S * M;
  long executed = 0;
  for (long t = 0; executed < total; ++t) {
    if (t > 4 * total + 16) throw std::logic_error("zero-bubble list scheduling made no progress");
    for (int r = 0; r < s.pp; ++r) {
      auto& list = s.ranks[r];
      bool ran = false;
      while (i_first[r] < bwd[r].size() && i_taken[r][i_first[r]]) ++i_first[r];
      for (size_t k = i_first[r]; k < bwd[r].size() && !ran; ++k) {
        if (i_taken[r][k]) continue;
        const Action& a = bwd[r][k];
        const bool ready = f_end[at(a.stage, a.microbatch)] <= t &&
                           (a.stage == S - 1 || i_end[at(a.stage + 1, a.microbatch)] <= t);
        if (!ready) {
          if (in_order) break;
          continue;
        }
        i_taken[r][k] = ran = true;
        i_end[at(a.stage, a.microbatch)] = t + 1;
        list.push_back({ActionType::kBackwardInput, a.stage, a.microbatch});
        pending_w[r].push_back({ActionType::kBackwardWeight, a.stage, a.microbatch});
      }
      while (f_first[r] < fwd[r].size() && f_taken[r][f_first[r]]) ++f_first[r];
      for (size_t k = f_first[r]; k < fwd[r].size() && !ran && in_flight[r] < limit[r]; ++k) {
        if (f_taken[r][k]) continue;
        const Action& a = fwd[r][k];
        if (a.stage > 0 && f_end[at(a.stage - 1, a.microbatch)] > t) {
          if (in_order) break;
          continue;
        }
        f_taken[r][k] = ran = true;
        f_end[at(a.stage, a.microbatch)] = t + 1;
        list.push_back({ActionType::kForward, a.stage, a.microbatch});
        ++in_flight[r];
      }
      if (!ran && !pending_w[r].empty()) {
        list.push_back(pending_w[r].front());
        pending_w[r].pop_front();
        --in_flight[r];
        ran = true;
      }
      if (ran) ++executed;
    }
  }
}

void interleaved_zero_bubble(PipelineSchedule& s) {
  const int total = s.stages_per_rank * s.microbatches;
  std::vector<std::vector<Action>> fwd(s.pp), bwd(s.pp);
  std::vector<int> limit(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    for (int k = 0; k < total; ++k) {
      fwd[r].push_back(interleaved_action(s, r, k, false, ActionType::kForward));
      bwd[r].push_back(interleaved_action(s, r, k, true, ActionType::kBackwardInput));
    }
    // (Interleaved) 1F1B's peak in-flight micro-batches (rank 0's) plus the pp − 1 W's that
    // fill the warm-up bubble. With it the list scheduling reaches the zero-bubble bound for
    // every pp ≤ 8, m ≤ 32, v ≤ 3 (the unit tests check it); 1F1B's peak alone, or plus one,
    // misses the bound for some pp ≥ 3. Not proven minimal: + ⌈pp / 2⌉ also met it there.
    limit[r] = warmup_forwards(s, 0) + 1 + (s.pp - 1);
  }
  zero_bubble(s, fwd, bwd, limit, true);
}

void zbv(PipelineSchedule& s) {
  std::vector<std::vector<Action>> fwd(s.pp), bwd(s.pp);
  std::vector<int> limit(s.pp, 2 * s.pp + s.pp - 1);  // 1F1B's 2·pp stage activations + pp − 1 W's
  for (int r = 0; r < s.pp; ++r) {
    const int down = r, up = 2 * s.pp - 1 - r;
    for (int mb = 0; mb < s.microbatches; ++mb) {
      fwd[r].push_back({ActionType::kForward, down, mb});
      fwd[r].push_back({ActionType::kForward, up, mb});
      bwd[r].push_back({ActionType::kBackwardInput, up, mb});
      bwd[r].push_back({ActionType::kBackwardInput, down, mb});
    }
  }
  zero_bubble(s, fwd, bwd, limit, false);
}

struct Where {
  int rank;
  size_t index;
};

std::string at_rank(int rank, const Action& a) {
  return "rank " + std::to_string(rank) + ", action " + to_string(a) + ": ";
}

}  // namespace

std::string to_string(const Action& a) {
  // One buffer, no temporaries: the schedule checks name every action of schedules of 10^5.
  // (std::to_chars: snprintf's format parsing cost more than the strings it saved.)
  char buf[48];
  char* end = std::to_chars(buf, buf + 16, a.stage).ptr;
  for (const char* c = type_code(a.type); *c; ++c) *end++ = *c;
  end = std::to_chars(end, buf + sizeof buf, a.microbatch).ptr;
  return std::string(buf, end);
}

Action parse_action(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  size_t j = text.size();
  while (j > i && std::isdigit(static_cast<unsigned char>(text[j - 1]))) --j;
  const std::string code = text.substr(i, j - i);
  if (i == 0 || j == text.size() || i > 9 || text.size() - j > 9)
    throw ScheduleError("action '" + text + "': expected {stage}{F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B}{microbatch}");
  for (int t = 0; t <= static_cast<int>(ActionType::kRecvGradient); ++t)
    if (code == type_code(static_cast<ActionType>(t)))
      return {static_cast<ActionType>(t), std::stoi(text.substr(0, i)), std::stoi(text.substr(j))};
  throw ScheduleError("action '" + text + "': unknown action type '" + code +
                      "' (expected F, B, I, W, SEND_F, RECV_F, SEND_B or RECV_B)");
}

int PipelineSchedule::rank_of(int stage) const {
  if (stage < 0 || stage >= num_stages())
    throw ScheduleError("stage " + std::to_string(stage) + " is outside [0, " + std::to_string(num_stages()) + ")");
  if (placement == StagePlacement::kLoop) return stage % pp;
  return stage < pp ? stage : 2 * pp - 1 - stage;
}

std::vector<int> PipelineSchedule::stages_of(int rank) const {
  if (placement == StagePlacement::kV) return {rank, 2 * pp - 1 - rank};
  std::vector<int> out;
  for (int c = 0; c < stages_per_rank; ++c) out.push_back(c * pp + rank);
  return out;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble",
                                                 "ZBVZeroBubble"};
  return names;
}

bool is_multi_stage(const std::string& name) {
  if (name == "GPipe" || name == "1F1B") return false;
  if (name == "Interleaved1F1B" || name == "InterleavedZeroBubble" || name == "ZBVZeroBubble") return true;
  throw ScheduleError(std::string(kScheduleKey) + ": unknown schedule '" + name + "' (expected one of " +
                      schedule_list() + ")");
}

void check_schedule_rules(const std::string& name, int pp, int m, int v) {
  is_multi_stage(name);  // rejects unknown names
  const std::string sched = std::string(kScheduleKey) + " = " + name + ": ";
  const std::string mbs = std::string(kMicrobatchKey) + ": schedule " + name + " with pp = " +
                          std::to_string(pp) + " got " + std::to_string(m) + " micro-batches per step; ";
  if (pp < 1) throw ScheduleError(sched + "needs pp ≥ 1, got " + std::to_string(pp));
  if (m < 1) throw ScheduleError(mbs + "needs at least 1");
  if ((name == "GPipe" || name == "1F1B") && v != 1)
    throw ScheduleError(sched + "runs one stage per rank, got " + std::to_string(v) +
                        " (use Interleaved1F1B, InterleavedZeroBubble or ZBVZeroBubble for more)");
  if (name == "Interleaved1F1B" && v < 2)
    throw ScheduleError(sched + "needs at least 2 stages per rank, got " + std::to_string(v) + " (use 1F1B for 1)");
  if (name == "InterleavedZeroBubble" && v < 1)
    throw ScheduleError(sched + "needs at least 1 stage per rank, got " + std::to_string(v));
  if (name == "ZBVZeroBubble" && v != 2)
    throw ScheduleError(sched + "places exactly 2 stages per rank (V shape), got " + std::to_string(v));
  if (name == "1F1B" && m < pp) throw ScheduleError(mbs + "1F1B needs micro-batches ≥ pp");
  if ((name == "Interleaved1F1B" || name == "InterleavedZeroBubble") && m % pp != 0)
    throw ScheduleError(mbs + "interleaved schedules need micro-batches to be a multiple of pp (Megatron-LM's rule)");
  if (name == "ZBVZeroBubble" && m < 2 * pp)
    throw ScheduleError(mbs + "ZBVZeroBubble needs micro-batches ≥ 2·pp (its number of stages)");
}

PipelineSchedule make_schedule(const std::string& name, int pp, int m, int v) {
  check_schedule_rules(name, pp, m, v);
  PipelineSchedule s;
  s.name = name;
  s.pp = pp;
  s.stages_per_rank = v;
  s.microbatches = m;
  s.placement = name == "ZBVZeroBubble" ? StagePlacement::kV : StagePlacement::kLoop;
  s.ranks.assign(pp, {});
  if (name == "GPipe") gpipe(s);
  else if (name == "1F1B" || name == "Interleaved1F1B") one_f_one_b(s);
  else if (name == "InterleavedZeroBubble") interleaved_zero_bubble(s);
  else zbv(s);
  insert_communication(s);
  validate_schedule(s);
  return s;
}

namespace {

/// Each compute action with the communication next to it: RECV right before its consumer, SEND
/// right after its producer (the lists simulate_schedule() times).
void insert_communication_adjacent(PipelineSchedule& s) {
  const int S = s.num_stages();
  for (int r = 0; r < s.pp; ++r) {
    std::vector<Action> out;
    for (const Action& a : s.ranks[r]) {
      if (!a.is_compute()) continue;
      const bool prev_remote = a.stage > 0 && s.rank_of(a.stage - 1) != r;
      const bool next_remote = a.stage < S - 1 && s.rank_of(a.stage + 1) != r;
      const bool backward = a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput;
      if (a.type == ActionType::kForward && prev_remote) out.push_back({ActionType::kRecvActivation, a.stage, a.microbatch});
      if (backward && next_remote) out.push_back({ActionType::kRecvGradient, a.stage, a.microbatch});
      out.push_back(a);
      if (a.type == ActionType::kForward && next_remote) out.push_back({ActionType::kSendActivation, a.stage, a.microbatch});
      if (backward && prev_remote) out.push_back({ActionType::kSendGradient, a.stage, a.microbatch});
    }
    s.ranks[r] = std::move(out);
  }
}

}  // namespace

void insert_communication(PipelineSchedule& s) {
  insert_communication_adjacent(s);
  // Time the lists, then post each receive in the receiver's first gap between compute actions
  // that is not before the message is sent: sender and receiver then meet in groups issued at
  // about the same time, which is what a stream-ordered backend needs (stream_order.hpp).
  SimulationResult sim;
  try {
    sim = simulate_schedule(s, {}, /*in_flight_states=*/false, /*timeline=*/false);
  } catch (const ScheduleError&) {
    return;  // a broken list: validate_schedule() names what is wrong with it
  }
  MessageTimes sent_at(s);  // (is gradient, receiving stage, mb) → producer's finish
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<Action>& list = s.ranks[r];
    for (size_t i = 0; i + 1 < list.size(); ++i) {
      const Action& a = list[i + 1];
      if (a.type == ActionType::kSendActivation) sent_at.put(false, a.stage + 1, a.microbatch, sim.finish[r][i]);
      if (a.type == ActionType::kSendGradient) sent_at.put(true, a.stage - 1, a.microbatch, sim.finish[r][i]);
    }
  }
  for (int r = 0; r < s.pp; ++r) {
    std::vector<Action> compute;
    std::vector<int64_t> starts;
    std::vector<std::vector<Action>> sends(1);  // [gap k] the sends right after compute k − 1
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (a.is_compute()) {
        compute.push_back(a);
        starts.push_back(sim.start[r][i]);
        sends.emplace_back();
      } else if (a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient) {
        sends.back().push_back(a);
      }
    }
    // [gap k] (send time, receive) for the gap right before compute k (k = size: after the last).
    std::vector<std::vector<std::pair<int64_t, Action>>> recvs(compute.size() + 1);
    for (const Action& a : s.ranks[r]) {
      if (a.type != ActionType::kRecvActivation && a.type != ActionType::kRecvGradient) continue;
      const int64_t t = sent_at.get(a.type == ActionType::kRecvGradient, a.stage, a.microbatch);
      // (The simulation ran every RECV after its SEND, so each has a time.)
      if (t < 0) throw std::out_of_range("insert_communication: a receive without its send");
      const size_t gap = size_t(std::lower_bound(starts.begin(), starts.end(), t) - starts.begin());
      recvs[gap].push_back({t, a});
    }
    std::vector<Action> out;
    for (size_t k = 0; k <= compute.size(); ++k) {
      out.insert(out.end(), sends[k].begin(), sends[k].end());
      std::stable_sort(recvs[k].begin(), recvs[k].end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      for (const auto& [t, a] : recvs[k]) out.push_back(a);
      if (k < compute.size()) out.push_back(compute[k]);
    }
    s.ranks[r] = std::move(out);
  }
}

void validate_schedule(const PipelineSchedule& s) {
  const int S = s.num_stages(), M = s.microbatches;
  if (static_cast<int>(s.ranks.size()) != s.pp)
    throw ScheduleError("schedule " + s.name + " has " + std::to_string(s.ranks.size()) + " rank lists for pp = " +
                        std::to_string(s.pp));
  // Where each (type, stage, mb) runs: a flat table (every action's stage and micro-batch are
  // checked in range before it is entered; rank −1: no such action), as the planner validates
  // schedules of 10^5 actions.
  constexpr size_t kTypes = size_t(ActionType::kRecvGradient) + 1;
  std::vector<Where> where(kTypes * size_t(std::max(S, 0)) * size_t(std::max(M, 0)), Where{-1, 0});
  auto slot = [&](ActionType t, int stage, int mb) { return (size_t(t) * size_t(S) + size_t(stage)) * size_t(M) + size_t(mb); };
  for (int r = 0; r < s.pp; ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (a.microbatch < 0 || a.microbatch >= M)
        throw ScheduleError(at_rank(r, a) + "micro-batch outside [0, " + std::to_string(M) + ")");
      if (a.stage < 0 || a.stage >= S || s.rank_of(a.stage) != r)
        throw ScheduleError(at_rank(r, a) + "stage " + std::to_string(a.stage) + " does not live on this rank");
      Where& w = where[slot(a.type, a.stage, a.microbatch)];
      if (w.rank >= 0)
        throw ScheduleError(at_rank(r, a) + "appears twice (action " + std::to_string(w.index) + " and " +
                            std::to_string(i) + ")");
      w = Where{r, i};
    }
  }
  auto find = [&](ActionType t, int stage, int mb) -> const Where* {
    if (stage < 0 || stage >= S || mb < 0 || mb >= M) return nullptr;
    const Where& w = where[slot(t, stage, mb)];
    return w.rank < 0 ? nullptr : &w;
  };
  auto name = [](ActionType t, int stage, int mb) { return to_string(Action{t, stage, mb}); };
  // `needed` (on rank r before index i) must be available: produced earlier on the same rank, or
  // received earlier on r and sent after the producer on the producer's rank.
  auto require = [&](int r, size_t i, const Action& a, ActionType producer_type, int producer_stage,
                     ActionType send_type, ActionType recv_type) {
    if (producer_type == ActionType::kBackwardInput && find(ActionType::kBackward, producer_stage, a.microbatch))
      producer_type = ActionType::kBackward;
    const Where* prod = find(producer_type, producer_stage, a.microbatch);
    // Named only in an error: the planner validates schedules of 10^5 actions.
    auto pname = [&] { return name(producer_type, producer_stage, a.microbatch); };
    if (!prod) throw ScheduleError(at_rank(r, a) + "needs " + pname() + ", which no rank runs");
    if (prod->rank == r) {
      if (prod->index > i) throw ScheduleError(at_rank(r, a) + "runs before " + pname() + ", which it depends on");
      return;
    }
    const Where* recv = find(recv_type, a.stage, a.microbatch);
    const Where* send = find(send_type, producer_stage, a.microbatch);
    if (!recv || recv->rank != r || recv->index > i)
      throw ScheduleError(at_rank(r, a) + "needs " + name(recv_type, a.stage, a.microbatch) + " before it");
    if (!send || send->index < prod->index)
      throw ScheduleError("rank " + std::to_string(prod->rank) + ": " + name(send_type, producer_stage, a.microbatch) +
                          " is missing or runs before " + pname() + " (needed by " + to_string(a) + " on rank " +
                          std::to_string(r) + ")");
  };
  for (int stage = 0; stage < S; ++stage) {
    const int r = s.rank_of(stage);
    for (int mb = 0; mb < M; ++mb) {
      const Where* f = find(ActionType::kForward, stage, mb);
      if (!f) throw ScheduleError("rank " + std::to_string(r) + ": " + name(ActionType::kForward, stage, mb) + " is missing");
      const Where* b = find(ActionType::kBackward, stage, mb);
      const Where* in = find(ActionType::kBackwardInput, stage, mb);
      const Where* w = find(ActionType::kBackwardWeight, stage, mb);
      if (b && (in || w))
        throw ScheduleError("rank " + std::to_string(r) + ": stage " + std::to_string(stage) + " micro-batch " +
                            std::to_string(mb) + " has both a full backward B and a split one I/W");
      if (!b && !in)
        throw ScheduleError("rank " + std::to_string(r) + ": " + name(ActionType::kBackward, stage, mb) + " (or " +
                            name(ActionType::kBackwardInput, stage, mb) + ") is missing");
      if (in && !w)
        throw ScheduleError("rank " + std::to_string(r) + ": " + name(ActionType::kBackwardWeight, stage, mb) +
                            " is missing (every I needs its W)");
      if (w && !in)
        throw ScheduleError("rank " + std::to_string(r) + ": " + name(ActionType::kBackwardWeight, stage, mb) +
                            " has no " + name(ActionType::kBackwardInput, stage, mb));
      if (w && w->index < in->index)
        throw ScheduleError(at_rank(r, s.ranks[r][w->index]) + "runs before its " +
                            name(ActionType::kBackwardInput, stage, mb));
    }
  }
  for (int stage = 0; stage < S; ++stage) {
    const int r = s.rank_of(stage);
    for (int mb = 0; mb < M; ++mb) {
      const Where* f = find(ActionType::kForward, stage, mb);
      const Where* b = find(ActionType::kBackward, stage, mb);
      const Where* in = find(ActionType::kBackwardInput, stage, mb);
      const Where* bwd = b ? b : in;
      const Action& fa = s.ranks[r][f->index];
      const Action& ba = s.ranks[r][bwd->index];
      if (bwd->index < f->index) throw ScheduleError(at_rank(r, ba) + "runs before " + to_string(fa));
      if (stage > 0)
        require(r, f->index, fa, ActionType::kForward, stage - 1, ActionType::kSendActivation, ActionType::kRecvActivation);
      if (stage < S - 1)
        require(r, bwd->index, ba, ActionType::kBackwardInput, stage + 1, ActionType::kSendGradient,
                ActionType::kRecvGradient);
    }
  }
  // Every communication action has its partner on the neighbouring stage's rank, and each
  // channel (sending stage → receiving stage, kind) delivers in the order the receiver expects,
  // so a runtime can match messages FIFO with the stage as tag.
  std::map<std::tuple<int, int, int>, std::vector<int>> sent, received;  // (kind, from stage, to stage) → mbs
  for (int r = 0; r < s.pp; ++r) {
    for (const Action& a : s.ranks[r]) {
      if (a.is_compute()) continue;
      const bool activation = a.type == ActionType::kSendActivation || a.type == ActionType::kRecvActivation;
      const bool send = a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient;
      const int peer_stage = (activation == send) ? a.stage + 1 : a.stage - 1;
      if (peer_stage < 0 || peer_stage >= S || s.rank_of(peer_stage) == r)
        throw ScheduleError(at_rank(r, a) + "has no peer on another rank (stage " + std::to_string(peer_stage) +
                            (peer_stage < 0 || peer_stage >= S ? " does not exist)" : " lives on the same rank)"));
      const ActionType partner = activation ? (send ? ActionType::kRecvActivation : ActionType::kSendActivation)
                                            : (send ? ActionType::kRecvGradient : ActionType::kSendGradient);
      if (!find(partner, peer_stage, a.microbatch))
        throw ScheduleError(at_rank(r, a) + "has no matching " + name(partner, peer_stage, a.microbatch) + " on rank " +
                            std::to_string(s.rank_of(peer_stage)));
      const int kind = activation ? 0 : 1;
      if (send) sent[{kind, a.stage, peer_stage}].push_back(a.microbatch);
      else received[{kind, peer_stage, a.stage}].push_back(a.microbatch);
    }
  }
  for (const auto& [channel, order] : sent) {
    const auto& got = received[channel];
    for (size_t k = 0; k < order.size(); ++k) {
      if (got[k] == order[k]) continue;
      const auto [kind, from, to] = channel;
      throw ScheduleError("channel stage " + std::to_string(from) + " → stage " + std::to_string(to) + " (" +
                          (kind == 0 ? "activations" : "gradients") + ", rank " + std::to_string(s.rank_of(from)) +
                          " → rank " + std::to_string(s.rank_of(to)) + "): message " + std::to_string(k) +
                          " is micro-batch " + std::to_string(order[k]) + " but the receiver expects micro-batch " +
                          std::to_string(got[k]));
    }
  }
  simulate_schedule(s, {}, /*in_flight_states=*/false, /*timeline=*/false);  // throws on deadlock
  check_stream_ordered(s);
}

PipelineSchedule forward_only_schedule(const PipelineSchedule& s) {
  PipelineSchedule f;
  f.name = s.name + " forward only";
  f.pp = s.pp;
  f.stages_per_rank = s.stages_per_rank;
  f.microbatches = 1;
  f.placement = s.placement;
  f.ranks.resize(size_t(s.pp));
  const int last = s.num_stages() - 1;
  for (int r = 0; r < s.pp; ++r) {
    std::vector<int> stages = s.stages_of(r);
    std::sort(stages.begin(), stages.end());
    for (int st : stages) {
      if (st > 0 && s.rank_of(st - 1) != r) f.ranks[size_t(r)].push_back({ActionType::kRecvActivation, st, 0});
      f.ranks[size_t(r)].push_back({ActionType::kForward, st, 0});
      if (st < last && s.rank_of(st + 1) != r) f.ranks[size_t(r)].push_back({ActionType::kSendActivation, st, 0});
    }
  }
  return f;
}

}  // namespace meshtrain
