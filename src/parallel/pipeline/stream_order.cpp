#include "parallel/pipeline/stream_order.hpp"

#include <charconv>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace meshtrain {

namespace {

bool is_send(ActionType t) { return t == ActionType::kSendActivation || t == ActionType::kSendGradient; }
bool is_activation(ActionType t) { return t == ActionType::kSendActivation || t == ActionType::kRecvActivation; }

/// The stage on the other end of a communication action.
int peer_stage(const Action& a) { return is_activation(a.type) == is_send(a.type) ? a.stage + 1 : a.stage - 1; }

/// What a message is, the same on both ends: (kind, receiving stage, micro-batch).
using Message = std::tuple<int, int, int>;
Message message_of(const Action& a) {
  return {is_activation(a.type) ? 0 : 1, is_send(a.type) ? peer_stage(a) : a.stage, a.microbatch};
}

std::string message_text(const Message& m) {
  const auto [kind, to, mb] = m;
  // One buffer, no temporaries: check_stream_ordered names every transfer of schedules of 10^5.
  // (std::to_chars: snprintf's format parsing cost more than the strings it saved.)
  std::string t;
  t.reserve(64);
  t += kind == 0 ? "the activation into stage " : "the gradient into stage ";
  char num[16];
  t.append(num, std::to_chars(num, num + sizeof num, to).ptr);
  t += " of micro-batch ";
  t.append(num, std::to_chars(num, num + sizeof num, mb).ptr);
  return t;
}

std::string group_text(const std::vector<StreamTransfer>& group) {
  std::string t = "[";
  for (size_t i = 0; i < group.size(); ++i) {
    if (i > 0) t += ' ';
    t += group[i].text;
  }
  return t + "]";
}

/// A send or receive located in the programs: its message and the rank's group number.
struct Posted {
  const StreamTransfer* transfer;
  size_t group;
};

/// The stream-ordered model of check_stream_programs() with names left out: per rank, which
/// steps are groups and what each compute step waits for, and each group's partners.
struct StreamModel {
  struct Rank {
    std::vector<long> group_of;       ///< [step] its group number, −1 for a compute step
    std::vector<size_t> group_step;   ///< [group] its step index
    std::vector<size_t> wait_begin;   ///< [step + 1] CSR offsets into waits
    std::vector<size_t> waits;        ///< group numbers the compute steps wait for
    std::vector<size_t> partner_begin;  ///< [group + 1] CSR offsets into partners
    std::vector<std::pair<int, size_t>> partners;  ///< (peer rank, its group) each group needs started
  };
  std::vector<Rank> ranks;
  /// Fills each rank's partner CSR from edges (rank, group, peer, peer's group), in edge order.
  void set_partners(const std::vector<std::tuple<int, size_t, int, size_t>>& edges) {
    for (Rank& k : ranks) k.partner_begin.assign(k.group_step.size() + 1, 0);
    for (const auto& [r, g, peer, pg] : edges) ++ranks[size_t(r)].partner_begin[g + 1];
    for (Rank& k : ranks) {
      for (size_t g = 0; g < k.group_step.size(); ++g) k.partner_begin[g + 1] += k.partner_begin[g];
      k.partners.resize(k.partner_begin.back());
    }
    std::vector<std::vector<size_t>> fill(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) fill[r].assign(ranks[r].partner_begin.begin(), ranks[r].partner_begin.end() - 1);
    for (const auto& [r, g, peer, pg] : edges) ranks[size_t(r)].partners[fill[size_t(r)][g]++] = {peer, pg};
  }
};

/// Where run_model() stopped, per rank: the next compute step (its step count when done), and
/// the groups started and completed.
struct ModelEnd {
  std::vector<size_t> next, started, completed;
  /// Whether every rank ran all its compute steps and completed all its groups.
  bool finished(const StreamModel& m) const {
    for (size_t r = 0; r < m.ranks.size(); ++r)
      if (next[r] != m.ranks[r].group_of.size() || completed[r] != m.ranks[r].group_step.size()) return false;
    return true;
  }
};

/// Runs the model of the file comment to completion or deadlock.
ModelEnd run_model(const StreamModel& m) {
  const size_t P = m.ranks.size();
  ModelEnd e{std::vector<size_t>(P, 0), std::vector<size_t>(P, 0), std::vector<size_t>(P, 0)};
  std::vector<size_t>& next = e.next;  // index of the next compute step (program size when done)
  std::vector<size_t>&started = e.started, &completed = e.completed;
  auto skip_groups = [&](size_t r) {
    const std::vector<long>& g = m.ranks[r].group_of;
    while (next[r] < g.size() && g[next[r]] >= 0) ++next[r];
  };
  for (size_t r = 0; r < P; ++r) skip_groups(r);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < P; ++r) {
      const StreamModel::Rank& k = m.ranks[r];
      // The compute stream: the next step runs once the groups it waits for completed.
      while (next[r] < k.group_of.size()) {
        bool ready = true;
        for (size_t w = k.wait_begin[next[r]]; w < k.wait_begin[next[r] + 1]; ++w) ready = ready && k.waits[w] < completed[r];
        if (!ready) break;
        ++next[r];
        skip_groups(r);
        progress = true;
      }
      // The communication stream: the next group starts after the previous one completed and
      // after every compute step issued before it.
      if (started[r] < k.group_step.size() && started[r] == completed[r] && next[r] >= k.group_step[started[r]]) {
        ++started[r];
        progress = true;
      }
    }
    for (size_t r = 0; r < P; ++r) {
      const StreamModel::Rank& k = m.ranks[r];
      if (completed[r] == started[r]) continue;
      bool ready = true;
      for (size_t p = k.partner_begin[completed[r]]; p < k.partner_begin[completed[r] + 1]; ++p)
        ready = ready && started[size_t(k.partners[p].first)] > k.partners[p].second;
      if (ready) {
        ++completed[r];
        progress = true;
      }
    }
  }
  return e;
}

/// check_stream_ordered's verdict without names: true when `s`'s programs (as
/// schedule_programs() builds them) pass check_stream_programs(). False also whenever anything
/// is out of the ordinary (a stage or micro-batch out of range, a message received twice on a
/// rank), so that the named check decides, and words, every failure. Integers only: the named
/// programs of a schedule of 10^5 actions cost more than generating it.
bool stream_ordered_quick(const PipelineSchedule& s) {
  const int P = int(s.ranks.size()), S = s.num_stages(), M = s.microbatches;
  if (P != s.pp || S < 1 || M < 1) return false;
  auto in_range = [&](const Action& a) { return a.stage >= 0 && a.stage < S && a.microbatch >= 0 && a.microbatch < M; };
  // Message (kind, receiving stage, mb) as one index; the receiving step of each, per rank.
  auto index_of = [&](const Message& msg) {
    const auto [kind, to, mb] = msg;
    return (size_t(kind) * size_t(S) + size_t(to)) * size_t(M) + size_t(mb);
  };
  std::vector<std::pair<int, size_t>> received_in(2 * size_t(S) * size_t(M), {-1, 0});  // (rank, step)
  StreamModel m;
  m.ranks.resize(size_t(P));
  // (from, to) → the messages with the group posting them, in send / receive order.
  struct Posts {
    std::vector<std::pair<size_t, size_t>> sent, got;  // (message index, group)
  };
  std::vector<Posts> posts(size_t(P) * size_t(P));
  for (int r = 0; r < P; ++r) {
    const std::vector<Action>& list = s.ranks[size_t(r)];
    StreamModel::Rank& k = m.ranks[size_t(r)];
    for (size_t i = 0; i < list.size();) {
      const Action& a = list[i];
      if (!in_range(a)) return false;
      if (a.is_compute()) {
        k.group_of.push_back(-1);
        ++i;
        continue;
      }
      const size_t step = k.group_of.size(), g = k.group_step.size();
      k.group_of.push_back(long(g));
      k.group_step.push_back(step);
      for (; i < list.size() && !list[i].is_compute(); ++i) {
        const Action& c = list[i];
        if (!in_range(c)) return false;
        const int peer_stage_ = peer_stage(c);
        if (peer_stage_ < 0 || peer_stage_ >= S) return false;
        const int peer = s.rank_of(peer_stage_);
        const size_t msg = index_of(message_of(c));
        if (is_send(c.type)) {
          posts[size_t(r) * size_t(P) + size_t(peer)].sent.push_back({msg, g});
        } else {
          posts[size_t(peer) * size_t(P) + size_t(r)].got.push_back({msg, g});
          if (received_in[msg].first == r) return false;
          received_in[msg] = {r, step};
        }
      }
    }
    // Each F / B / I waits for the group that received its input or output gradient.
    k.wait_begin.assign(k.group_of.size() + 1, 0);
    for (size_t i = 0, step = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (!a.is_compute()) {
        while (i + 1 < list.size() && !list[i + 1].is_compute()) ++i;
        k.wait_begin[++step] = k.waits.size();
        continue;
      }
      const bool fwd = a.type == ActionType::kForward;
      if (fwd || a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) {
        const auto& [rank, at] = received_in[index_of({fwd ? 0 : 1, a.stage, a.microbatch})];
        if (rank == r) k.waits.push_back(size_t(k.group_of[at]));
      }
      k.wait_begin[++step] = k.waits.size();
    }
  }
  // Match the k-th send with the k-th receive of each rank pair, as NCCL does.
  std::vector<std::tuple<int, size_t, int, size_t>> edges;
  for (int from = 0; from < P; ++from)
    for (int to = 0; to < P; ++to) {
      const Posts& p = posts[size_t(from) * size_t(P) + size_t(to)];
      if (p.sent.size() != p.got.size()) return false;
      for (size_t k = 0; k < p.sent.size(); ++k) {
        if (p.sent[k].first != p.got[k].first) return false;
        edges.emplace_back(from, p.sent[k].second, to, p.got[k].second);
        edges.emplace_back(to, p.got[k].second, from, p.sent[k].second);
      }
    }
  m.set_partners(edges);
  return run_model(m).finished(m);
}

}  // namespace

void check_stream_programs(const std::vector<StreamProgram>& ranks, const std::string& what) {
  const int P = static_cast<int>(ranks.size());
  // Per rank: the step index of each group, and the group number of each step (-1: compute).
  std::vector<std::vector<size_t>> group_step(P);
  std::vector<std::vector<long>> group_of(P);
  // (from rank, to rank) → the transfers in send order / receive order.
  std::map<std::pair<int, int>, std::vector<Posted>> sends, recvs;
  for (int r = 0; r < P; ++r) {
    group_of[r].assign(ranks[r].size(), -1);
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const StreamStep& step = ranks[r][i];
      if (step.group.empty()) {
        for (size_t w : step.waits)
          if (w >= ranks[r].size() || ranks[r][w].group.empty())
            throw std::invalid_argument(what + ": rank " + std::to_string(r) + " step " + std::to_string(i) +
                                        " waits for step " + std::to_string(w) + ", which is no group");
        continue;
      }
      const size_t g = group_step[r].size();
      group_of[r][i] = long(g);
      group_step[r].push_back(i);
      for (const StreamTransfer& t : step.group) {
        if (t.peer < 0 || t.peer >= P)
          throw std::invalid_argument(what + ": rank " + std::to_string(r) + " " + t.text + " names peer " +
                                      std::to_string(t.peer) + " of " + std::to_string(P) + " ranks");
        (t.send ? sends[{r, t.peer}] : recvs[{t.peer, r}]).push_back({&t, g});
      }
    }
  }

  // Match the k-th send with the k-th receive of each rank pair, as NCCL does.
  std::vector<std::tuple<int, size_t, int, size_t>> edges;  // (rank, group) needs (peer, its group) started
  const std::string why = " (NCCL has no message tags: it matches the sends and receives between two ranks in order)";
  for (const auto& [pair, sent] : sends) {
    const std::vector<Posted>& got = recvs[pair];
    const auto [from, to] = pair;
    const std::string where = what + ": rank " + std::to_string(from) + " → rank " + std::to_string(to) + ": ";
    for (size_t k = 0; k < sent.size(); ++k) {
      if (k >= got.size())
        throw ScheduleError(where + "message " + std::to_string(k) + " (" + sent[k].transfer->message +
                            ") has no receive" + why);
      if (got[k].transfer->message != sent[k].transfer->message)
        throw ScheduleError(where + "message " + std::to_string(k) + " is sent as " + sent[k].transfer->message +
                            " but received as " + got[k].transfer->message + why);
      edges.emplace_back(from, sent[k].group, to, got[k].group);
      edges.emplace_back(to, got[k].group, from, sent[k].group);
    }
    if (got.size() > sent.size())
      throw ScheduleError(where + "receive " + std::to_string(sent.size()) + " (" +
                          got[sent.size()].transfer->message + ") has no send" + why);
  }
  for (const auto& [pair, got] : recvs)
    if (!sends.count(pair) && !got.empty())
      throw ScheduleError(what + ": rank " + std::to_string(pair.first) + " → rank " + std::to_string(pair.second) +
                          ": receive 0 (" + got[0].transfer->message + ") has no send");

  // Run the model: per rank, the next compute step, the groups started and those completed.
  StreamModel m;
  m.ranks.resize(size_t(P));
  for (int r = 0; r < P; ++r) {
    StreamModel::Rank& k = m.ranks[size_t(r)];
    k.group_of = group_of[size_t(r)];
    k.group_step = group_step[size_t(r)];
    k.wait_begin.push_back(0);
    for (const StreamStep& step : ranks[size_t(r)]) {
      for (size_t w : step.waits) k.waits.push_back(size_t(group_of[size_t(r)][w]));
      k.wait_begin.push_back(k.waits.size());
    }
  }
  m.set_partners(edges);
  const ModelEnd end = run_model(m);
  const std::vector<size_t>&next = end.next, &started = end.started, &completed = end.completed;
  std::string blocked;
  for (int r = 0; r < P; ++r) {
    if (next[r] == ranks[r].size() && completed[r] == group_step[r].size()) continue;
    if (!blocked.empty()) blocked += "; ";
    blocked += "rank " + std::to_string(r) + " at ";
    if (next[r] < ranks[r].size()) blocked += ranks[r][next[r]].text;
    else blocked += "the end of its compute";
    if (completed[r] < group_step[r].size())
      blocked += ", communication group " + group_text(ranks[r][group_step[r][completed[r]]].group) +
                 (started[r] > completed[r] ? " waiting for its partners" : " not started");
  }
  if (!blocked.empty())
    throw ScheduleError(what + " deadlocks on a stream-ordered backend (NCCL groups of consecutive sends and "
                        "receives): " + blocked);
}

std::vector<CommBatch> communication_batches(const std::vector<Action>& list) {
  std::vector<CommBatch> out;
  for (size_t i = 0; i < list.size();) {
    if (list[i].is_compute()) {
      ++i;
      continue;
    }
    CommBatch b{i, i};
    while (b.end < list.size() && !list[b.end].is_compute()) ++b.end;
    out.push_back(b);
    i = b.end;
  }
  return out;
}

std::vector<StreamProgram> schedule_programs(const PipelineSchedule& s) {
  std::vector<StreamProgram> programs(s.ranks.size());
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const std::vector<Action>& list = s.ranks[r];
    StreamProgram& prog = programs[r];
    std::map<Message, size_t> received_in;  // message → the step of the group receiving it here
    size_t i = 0;
    for (const CommBatch& b : communication_batches(list)) {
      for (; i < b.begin; ++i) prog.push_back({{}, {}, to_string(list[i])});
      StreamStep group;
      for (; i < b.end; ++i) {
        const Action& a = list[i];
        group.group.push_back({is_send(a.type), s.rank_of(peer_stage(a)), message_text(message_of(a)), to_string(a)});
        if (!is_send(a.type)) received_in[message_of(a)] = prog.size();
      }
      prog.push_back(std::move(group));
    }
    for (; i < list.size(); ++i) prog.push_back({{}, {}, to_string(list[i])});
    // Each F / B / I waits for the group that received its input or output gradient.
    for (size_t k = 0, a = 0; k < prog.size(); ++k) {
      if (!prog[k].group.empty()) {
        a += prog[k].group.size();
        continue;
      }
      const Action& act = list[a++];
      Message m;
      if (act.type == ActionType::kForward) m = {0, act.stage, act.microbatch};
      else if (act.type == ActionType::kBackward || act.type == ActionType::kBackwardInput) m = {1, act.stage, act.microbatch};
      else continue;
      if (auto it = received_in.find(m); it != received_in.end()) prog[k].waits.push_back(it->second);
    }
  }
  return programs;
}

void check_stream_ordered(const PipelineSchedule& s) {
  // The integer pass proves the common case; the named programs word any failure it finds.
  if (stream_ordered_quick(s)) return;
  check_stream_programs(schedule_programs(s), "schedule " + s.name);
}

}  // namespace meshtrain
