#include "parallel/pipeline/stream_order.hpp"

#include <map>
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
  return std::string(kind == 0 ? "the activation into" : "the gradient into") + " stage " + std::to_string(to) +
         " of micro-batch " + std::to_string(mb);
}

std::string batch_text(const std::vector<Action>& list, const CommBatch& b) {
  std::string t = "[";
  for (size_t i = b.begin; i < b.end; ++i) {
    if (i > b.begin) t += ' ';
    t += to_string(list[i]);
  }
  return t + "]";
}

}  // namespace

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

void check_stream_ordered(const PipelineSchedule& s) {
  const int P = static_cast<int>(s.ranks.size());
  std::vector<std::vector<CommBatch>> batches(P);
  // Per rank, per action: the batch holding it (communication) or -1 (compute).
  std::vector<std::vector<int>> batch_of(P);
  // Per rank: the batch of the receive each compute action consumes, or -1.
  std::vector<std::vector<int>> consumes(P);
  // (from rank, to rank) → the messages in send order / receive order, with the batch on that end.
  std::map<std::pair<int, int>, std::vector<std::pair<Message, int>>> sends, recvs;
  for (int r = 0; r < P; ++r) {
    const std::vector<Action>& list = s.ranks[r];
    batches[r] = communication_batches(list);
    batch_of[r].assign(list.size(), -1);
    std::map<Message, int> received_in;  // message → batch of its receive on this rank
    for (size_t b = 0; b < batches[r].size(); ++b) {
      for (size_t i = batches[r][b].begin; i < batches[r][b].end; ++i) {
        const Action& a = list[i];
        batch_of[r][i] = static_cast<int>(b);
        const int peer = s.rank_of(peer_stage(a));
        if (is_send(a.type)) {
          sends[{r, peer}].push_back({message_of(a), int(b)});
        } else {
          recvs[{peer, r}].push_back({message_of(a), int(b)});
          received_in[message_of(a)] = int(b);
        }
      }
    }
    consumes[r].assign(list.size(), -1);
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      Message m;
      if (a.type == ActionType::kForward) m = {0, a.stage, a.microbatch};
      else if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) m = {1, a.stage, a.microbatch};
      else continue;
      if (auto it = received_in.find(m); it != received_in.end()) consumes[r][i] = it->second;
    }
  }

  // Match the k-th send with the k-th receive of each rank pair, as NCCL does.
  std::vector<std::vector<std::vector<std::pair<int, int>>>> partners(P);  // [rank][batch] → (peer, its batch)
  for (int r = 0; r < P; ++r) partners[r].resize(batches[r].size());
  for (const auto& [pair, sent] : sends) {
    const auto& got = recvs[pair];
    const auto [from, to] = pair;
    const std::string where = "rank " + std::to_string(from) + " → rank " + std::to_string(to) + ": ";
    const std::string why = " (NCCL has no message tags: it matches the sends and receives between two ranks in order)";
    for (size_t k = 0; k < sent.size(); ++k) {
      if (k >= got.size())
        throw ScheduleError(where + "message " + std::to_string(k) + " (" + message_text(sent[k].first) +
                            ") has no receive" + why);
      if (got[k].first != sent[k].first)
        throw ScheduleError(where + "message " + std::to_string(k) + " is sent as " + message_text(sent[k].first) +
                            " but received as " + message_text(got[k].first) + why);
      partners[from][size_t(sent[k].second)].push_back({to, got[k].second});
      partners[to][size_t(got[k].second)].push_back({from, sent[k].second});
    }
    if (got.size() > sent.size())
      throw ScheduleError(where + "receive " + std::to_string(sent.size()) + " (" + message_text(got[sent.size()].first) +
                          ") has no send" + why);
  }
  for (const auto& [pair, got] : recvs)
    if (!sends.count(pair) && !got.empty())
      throw ScheduleError("rank " + std::to_string(pair.first) + " → rank " + std::to_string(pair.second) +
                          ": receive 0 (" + message_text(got[0].first) + ") has no send");

  // Run the model: per rank, the next compute action, the groups started and those completed.
  std::vector<size_t> next(P, 0);    // index of the next compute action (list size when done)
  std::vector<size_t> started(P, 0), completed(P, 0);
  std::vector<std::vector<char>> done(P);
  for (int r = 0; r < P; ++r) done[r].assign(batches[r].size(), 0);
  auto skip_comm = [&](int r) {
    while (next[r] < s.ranks[r].size() && !s.ranks[r][next[r]].is_compute()) ++next[r];
  };
  for (int r = 0; r < P; ++r) skip_comm(r);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      // The compute stream: the next action runs once the receive it consumes completed.
      while (next[r] < s.ranks[r].size()) {
        const int b = consumes[r][next[r]];
        if (b >= 0 && !done[r][size_t(b)]) break;
        ++next[r];
        skip_comm(r);
        progress = true;
      }
      // The communication stream: the next group starts after the previous one completed and
      // after every compute action issued before it.
      if (started[r] < batches[r].size() && started[r] == completed[r] && next[r] >= batches[r][started[r]].begin) {
        ++started[r];
        progress = true;
      }
    }
    for (int r = 0; r < P; ++r) {
      if (completed[r] == started[r]) continue;
      const size_t b = completed[r];
      bool ready = true;
      for (const auto& [peer, pb] : partners[r][b]) ready = ready && started[size_t(peer)] > size_t(pb);
      if (ready) {
        done[r][b] = 1;
        ++completed[r];
        progress = true;
      }
    }
  }
  std::string blocked;
  for (int r = 0; r < P; ++r) {
    if (next[r] == s.ranks[r].size() && completed[r] == batches[r].size()) continue;
    if (!blocked.empty()) blocked += "; ";
    blocked += "rank " + std::to_string(r) + " at ";
    if (next[r] < s.ranks[r].size()) blocked += to_string(s.ranks[r][next[r]]);
    else blocked += "the end of its compute";
    if (completed[r] < batches[r].size())
      blocked += ", communication group " + batch_text(s.ranks[r], batches[r][completed[r]]) +
                 (started[r] > completed[r] ? " waiting for its partners" : " not started");
  }
  if (!blocked.empty())
    throw ScheduleError("schedule " + s.name + " deadlocks on a stream-ordered backend (NCCL groups of consecutive "
                        "sends and receives): " + blocked);
}

}  // namespace meshtrain
