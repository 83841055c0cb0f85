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
  std::vector<std::vector<std::vector<std::pair<int, size_t>>>> partners(P);  // [rank][group] → (peer, its group)
  for (int r = 0; r < P; ++r) partners[r].resize(group_step[r].size());
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
      partners[from][sent[k].group].push_back({to, got[k].group});
      partners[to][got[k].group].push_back({from, sent[k].group});
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
  std::vector<size_t> next(P, 0);  // index of the next compute step (program size when done)
  std::vector<size_t> started(P, 0), completed(P, 0);
  auto skip_groups = [&](int r) {
    while (next[r] < ranks[r].size() && !ranks[r][next[r]].group.empty()) ++next[r];
  };
  for (int r = 0; r < P; ++r) skip_groups(r);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      // The compute stream: the next step runs once the groups it waits for completed.
      while (next[r] < ranks[r].size()) {
        bool ready = true;
        for (size_t w : ranks[r][next[r]].waits) ready = ready && size_t(group_of[r][w]) < completed[r];
        if (!ready) break;
        ++next[r];
        skip_groups(r);
        progress = true;
      }
      // The communication stream: the next group starts after the previous one completed and
      // after every compute step issued before it.
      if (started[r] < group_step[r].size() && started[r] == completed[r] && next[r] >= group_step[r][started[r]]) {
        ++started[r];
        progress = true;
      }
    }
    for (int r = 0; r < P; ++r) {
      if (completed[r] == started[r]) continue;
      bool ready = true;
      for (const auto& [peer, pg] : partners[r][completed[r]]) ready = ready && started[size_t(peer)] > pg;
      if (ready) {
        ++completed[r];
        progress = true;
      }
    }
  }
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

void check_stream_ordered(const PipelineSchedule& s) { check_stream_programs(schedule_programs(s), "schedule " + s.name); }

}  // namespace meshtrain
