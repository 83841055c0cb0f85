// Pipeline schedules as data (parallel/pipeline/): every generator, for pp ≤ 8 and m ≤ 32 where
// its rules allow, yields lists that validate (matched sends / receives, dependency order, each
// F / B / I / W exactly once), simulate without deadlock under unit costs, and whose bubble
// fraction equals the papers' formula exactly (simulate.hpp states the costs and formulas).
// Every generated list also runs on a stream-ordered backend (NCCL: consecutive sends and
// receives in one group, messages matched in order without tags; stream_order.hpp). The rules
// refuse bad (pp, m, v) combinations naming the deck key; hand-broken lists are rejected with a
// message naming the rank and action; the CSV reader round-trips generated lists.
#define BOOST_TEST_MODULE pp_schedule
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/schedule_csv.hpp"
#include "parallel/pipeline/simulate.hpp"
#include "parallel/pipeline/stage_split.hpp"
#include "parallel/pipeline/stream_order.hpp"

using namespace meshtrain;

namespace {

std::vector<int> stages_per_rank_to_try(const std::string& name) {
  if (name == "GPipe" || name == "1F1B") return {1};
  if (name == "Interleaved1F1B") return {2, 3, 4};
  if (name == "InterleavedZeroBubble") return {1, 2, 3};
  return {2};
}

/// Counts each compute action of `s` by (type, stage, mb) independently of validate_schedule().
void check_each_action_once(const PipelineSchedule& s) {
  std::map<std::tuple<ActionType, int, int>, int> count;
  for (const auto& list : s.ranks)
    for (const Action& a : list)
      if (a.is_compute()) ++count[{a.type, a.stage, a.microbatch}];
  const bool split = s.name == "InterleavedZeroBubble" || s.name == "ZBVZeroBubble";
  for (int st = 0; st < s.num_stages(); ++st)
    for (int mb = 0; mb < s.microbatches; ++mb) {
      BOOST_TEST((count[{ActionType::kForward, st, mb}]) == 1);
      if (split) {
        BOOST_TEST((count[{ActionType::kBackwardInput, st, mb}]) == 1);
        BOOST_TEST((count[{ActionType::kBackwardWeight, st, mb}]) == 1);
      } else {
        BOOST_TEST((count[{ActionType::kBackward, st, mb}]) == 1);
      }
    }
  size_t computes = 0;
  for (const auto& [k, n] : count) computes += n;
  BOOST_TEST(computes == size_t(s.num_stages()) * s.microbatches * (split ? 3 : 2));
}

/// A valid 1F1B schedule for the hand-broken cases below to edit.
PipelineSchedule one_f_one_b(int pp, int m) { return make_schedule("1F1B", pp, m, 1); }

size_t index_of(const std::vector<Action>& list, const std::string& text) {
  for (size_t i = 0; i < list.size(); ++i)
    if (to_string(list[i]) == text) return i;
  BOOST_FAIL("action " + text + " not in the list");
  return 0;
}

void expect_rejected(const PipelineSchedule& s, const std::string& part) {
  try {
    validate_schedule(s);
    BOOST_ERROR("schedule was accepted; expected an error containing '" + part + "'");
  } catch (const ScheduleError& e) {
    BOOST_TEST_INFO(e.what());
    BOOST_TEST(std::string(e.what()).find(part) != std::string::npos);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_schedule_validates_and_meets_its_formula) {
  int built = 0;
  for (const std::string& name : schedule_names()) {
    for (int v : stages_per_rank_to_try(name)) {
      for (int pp = 1; pp <= 8; ++pp) {
        for (int m = 1; m <= 32; ++m) {
          try {
            check_schedule_rules(name, pp, m, v);
          } catch (const ScheduleError& e) {
            BOOST_TEST(std::string(e.what()).find("[parallelism] pipeline_parallel_") != std::string::npos);
            continue;
          }
          BOOST_TEST_CONTEXT(name << " pp " << pp << " m " << m << " v " << v) {
            const PipelineSchedule s = make_schedule(name, pp, m, v);  // validates
            ++built;
            BOOST_CHECK_NO_THROW(check_stream_ordered(s));
            check_each_action_once(s);
            const SimulationResult r = simulate_schedule(s, {}, true);
            // F + B = F + I + W = 3 units per stage and micro-batch.
            for (int rank = 0; rank < pp; ++rank) BOOST_TEST(r.busy[rank] == int64_t(3) * v * m);
            // Exact: the worst rank idles (pp − 1)·(F + B) for GPipe / 1F1B, (pp − 1)·(F + B) over v
            // chunks interleaved, and pp − 1 units for the zero-bubble schedules.
            const int64_t worst_idle = *std::max_element(r.idle.begin(), r.idle.end());
            if (name == "GPipe" || name == "1F1B" || name == "Interleaved1F1B") BOOST_TEST(worst_idle == 3 * (pp - 1));
            else BOOST_TEST(worst_idle == pp - 1);
            BOOST_TEST(r.bubble_fraction() == textbook_bubble(s).value, boost::test_tools::tolerance(1e-12));
            // Activation memory in stage micro-batches (forward run, B or W not yet): 1F1B's
            // pp − rank; the zero-bubble schedules at most (interleaved) 1F1B's peak plus the
            // pp − 1 W's that fill bubbles, whatever m is (GPipe holds all m).
            if (name == "1F1B")
              for (int rank = 0; rank < pp; ++rank) BOOST_TEST(r.peak_in_flight[rank] == pp - rank);
            if (name == "GPipe") BOOST_TEST(r.peak_in_flight[0] == m);
            if (name == "InterleavedZeroBubble") {
              const int one_f_one_b = v == 1 ? pp : simulate_schedule(make_schedule("Interleaved1F1B", pp, m, v)).peak_in_flight[0];
              for (int rank = 0; rank < pp; ++rank) BOOST_TEST(r.peak_in_flight[rank] <= one_f_one_b + pp - 1);
            }
            if (name == "ZBVZeroBubble")
              for (int rank = 0; rank < pp; ++rank) BOOST_TEST(r.peak_in_flight[rank] <= 3 * pp - 1);
            // In-flight states: per rank, their largest count (held + the running one) is the
            // peak; counted over the states whose stages have all run a backward, 1F1B with
            // m > pp reaches its peak again, GPipe never does (every forward comes first: its
            // second backward still holds m − 1).
            for (int rank = 0; rank < pp; ++rank) {
              auto largest = [&](const std::vector<SimulationResult::InFlightState>& states) {
                int most = 0;
                for (const SimulationResult::InFlightState& st : states) {
                  BOOST_TEST(st.held.size() == size_t(v));
                  BOOST_TEST(st.pending.size() == size_t(v));
                  BOOST_TEST((st.running >= 0 && st.running < v));
                  // Only split backwards leave micro-batches between I and W.
                  const int pending = std::accumulate(st.pending.begin(), st.pending.end(), 0);
                  const bool weight = st.phase == SimulationResult::InFlightState::Phase::kWeight;
                  if (name.find("ZeroBubble") == std::string::npos) BOOST_TEST((pending == 0 && !weight));
                  most = std::max(most, (weight ? 0 : 1) + pending + std::accumulate(st.held.begin(), st.held.end(), 0));
                }
                return most;
              };
              BOOST_TEST(largest(r.in_flight_states[rank]) == r.peak_in_flight[rank]);
              std::vector<SimulationResult::InFlightState> backed;
              for (const SimulationResult::InFlightState& st : r.in_flight_states[rank]) {
                BOOST_TEST(st.backed.size() == size_t(v));
                if (std::all_of(st.backed.begin(), st.backed.end(), [](char b) { return b != 0; })) backed.push_back(st);
              }
              if (name == "1F1B" && m > pp) BOOST_TEST(largest(backed) == r.peak_in_flight[rank]);
              if (name == "GPipe") BOOST_TEST(largest(backed) == m - 1);
            }
          }
        }
      }
    }
  }
  BOOST_TEST(built > 1000);
}

BOOST_AUTO_TEST_CASE(rules_name_the_deck_key) {
  auto refuses = [](const std::string& name, int pp, int m, int v, const std::string& key, const std::string& rule) {
    try {
      check_schedule_rules(name, pp, m, v);
      BOOST_ERROR(name + " accepted pp " + std::to_string(pp) + " m " + std::to_string(m));
    } catch (const ScheduleError& e) {
      BOOST_TEST_INFO(e.what());
      BOOST_TEST(std::string(e.what()).find(key) != std::string::npos);
      BOOST_TEST(std::string(e.what()).find(rule) != std::string::npos);
    }
  };
  const std::string mbs = "[parallelism] pipeline_parallel_microbatch_size";
  const std::string sched = "[parallelism] pipeline_parallel_schedule";
  refuses("1F1B", 4, 3, 1, mbs, "micro-batches ≥ pp");
  refuses("Interleaved1F1B", 4, 6, 2, mbs, "multiple of pp");
  refuses("InterleavedZeroBubble", 3, 4, 2, mbs, "multiple of pp");
  refuses("ZBVZeroBubble", 4, 7, 2, mbs, "micro-batches ≥ 2·pp");
  refuses("GPipe", 2, 4, 2, sched, "one stage per rank");
  refuses("Interleaved1F1B", 2, 4, 1, sched, "at least 2 stages");
  refuses("ZBVZeroBubble", 2, 4, 3, sched, "exactly 2 stages");
  refuses("PipeDream", 2, 4, 1, sched, "unknown schedule");
  BOOST_CHECK_THROW(make_schedule("1F1B", 4, 3, 1), ScheduleError);
  BOOST_CHECK_NO_THROW(make_schedule("GPipe", 4, 3, 1));  // GPipe has no micro-batch rule
}

BOOST_AUTO_TEST_CASE(a_dropped_receive_is_rejected) {
  PipelineSchedule s = one_f_one_b(2, 2);
  auto& r1 = s.ranks[1];
  r1.erase(r1.begin() + index_of(r1, "1RECV_F1"));
  expect_rejected(s, "rank 1, action 1F1: needs 1RECV_F1 before it");
}

BOOST_AUTO_TEST_CASE(a_missing_backward_is_rejected) {
  PipelineSchedule s = one_f_one_b(3, 3);
  auto& r2 = s.ranks[2];
  r2.erase(r2.begin() + index_of(r2, "2B1"));
  expect_rejected(s, "rank 2: 2B1 (or 2I1) is missing");
}

BOOST_AUTO_TEST_CASE(a_backward_before_its_forward_is_rejected) {
  PipelineSchedule s = one_f_one_b(2, 2);
  auto& r1 = s.ranks[1];
  std::swap(r1[index_of(r1, "1F0")], r1[index_of(r1, "1B0")]);
  expect_rejected(s, "rank 1, action 1B0: runs before 1F0");
}

BOOST_AUTO_TEST_CASE(a_weight_gradient_before_its_input_gradient_is_rejected) {
  PipelineSchedule s = make_schedule("InterleavedZeroBubble", 2, 2, 1);
  auto& r0 = s.ranks[0];
  std::swap(r0[index_of(r0, "0I1")], r0[index_of(r0, "0W1")]);
  expect_rejected(s, "rank 0, action 0W1: runs before its 0I1");
}

BOOST_AUTO_TEST_CASE(receives_out_of_channel_order_are_rejected) {
  PipelineSchedule s = make_schedule("GPipe", 2, 2, 1);
  auto& r1 = s.ranks[1];  // RECV_F0 F0 RECV_F1 F1 …: receive micro-batch 1 first
  std::swap(r1[index_of(r1, "1RECV_F0")], r1[index_of(r1, "1RECV_F1")]);
  std::swap(r1[index_of(r1, "1F0")], r1[index_of(r1, "1F1")]);
  expect_rejected(s, "channel stage 0 → stage 1 (activations, rank 0 → rank 1): message 0 is micro-batch 0 "
                     "but the receiver expects micro-batch 1");
}

BOOST_AUTO_TEST_CASE(a_send_after_a_blocking_receive_deadlocks) {
  PipelineSchedule s = make_schedule("GPipe", 2, 1, 1);  // rank 0: F0 SEND_F0 RECV_B0 B0
  auto& r0 = s.ranks[0];
  std::swap(r0[index_of(r0, "0SEND_F0")], r0[index_of(r0, "0RECV_B0")]);
  expect_rejected(s, "deadlocks: rank 0 waits at action 1 0RECV_B0; rank 1 waits at action 0 1RECV_F0");
}

BOOST_AUTO_TEST_CASE(receives_next_to_their_consumers_deadlock_on_nccl) {
  // Interleaved 1F1B at pp 2 with each RECV moved right before the action that consumes it:
  // fine for MPI's independent tagged transfers, but on one NCCL stream rank 0's group
  // [2SEND_B0] waits for rank 1's receive, which sits behind rank 1's group [3SEND_B1
  // 1RECV_F2], which waits for rank 0. insert_communication() posts receives earlier.
  PipelineSchedule s = make_schedule("Interleaved1F1B", 2, 4, 2);
  for (auto& list : s.ranks) {
    std::vector<Action> out;
    for (const Action& a : list) {
      if (a.type == ActionType::kRecvActivation || a.type == ActionType::kRecvGradient) continue;
      const ActionType recv = a.type == ActionType::kForward ? ActionType::kRecvActivation : ActionType::kRecvGradient;
      if (a.is_compute() && a.type != ActionType::kBackwardWeight &&
          std::find(list.begin(), list.end(), Action{recv, a.stage, a.microbatch}) != list.end())
        out.push_back({recv, a.stage, a.microbatch});
      out.push_back(a);
    }
    list = std::move(out);
  }
  BOOST_CHECK_NO_THROW(simulate_schedule(s));
  try {
    check_stream_ordered(s);
    BOOST_ERROR("the schedule was accepted");
  } catch (const ScheduleError& e) {
    BOOST_TEST(std::string(e.what()).find("deadlocks on a stream-ordered backend") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("rank 0 at 2B1, communication group [2SEND_B0] waiting for its partners") !=
                   std::string::npos,
               e.what());
  }
}

BOOST_AUTO_TEST_CASE(messages_between_two_ranks_must_keep_their_order) {
  // Rank 1 sends stage 1's activation of micro-batch 2 after stage 1's gradient of micro-batch
  // 0, both to rank 0, which receives them the other way round: each kind's channel is still in
  // order (MPI's tags would cope) but NCCL would fill each buffer with the other's message.
  PipelineSchedule s = make_schedule("Interleaved1F1B", 2, 4, 2);
  auto& r1 = s.ranks[1];
  const Action moved = r1[index_of(r1, "1SEND_F2")];
  r1.erase(r1.begin() + index_of(r1, "1SEND_F2"));
  r1.insert(r1.begin() + index_of(r1, "1SEND_B0") + 1, moved);
  BOOST_CHECK_NO_THROW(simulate_schedule(s));
  expect_rejected(s, "rank 1 → rank 0: message 4 is sent as the gradient into stage 0 of micro-batch 0 but received "
                     "as the activation into stage 2 of micro-batch 2 (NCCL has no message tags");
}

BOOST_AUTO_TEST_CASE(the_integer_stream_check_agrees_with_the_named_one) {
  // check_stream_ordered proves schedules with integers and words failures with the named
  // programs: on generated lists with one pair of neighbouring actions swapped (many break the
  // stream order, some do not), its verdict and message are the named check's.
  auto named = [](const PipelineSchedule& s) {
    try {
      check_stream_programs(schedule_programs(s), "schedule " + s.name);
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  int rejected = 0, tried = 0;
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
           {"1F1B", 1}, {"Interleaved1F1B", 2}, {"InterleavedZeroBubble", 2}, {"ZBVZeroBubble", 2}}) {
    const PipelineSchedule base = make_schedule(name, 3, 6, v);
    for (size_t r = 0; r < base.ranks.size(); ++r)
      for (size_t i = 0; i + 1 < base.ranks[r].size(); i += 3) {
        PipelineSchedule s = base;
        std::swap(s.ranks[r][i], s.ranks[r][i + 1]);
        std::string got;
        try {
          check_stream_ordered(s);
        } catch (const std::exception& e) {
          got = e.what();
        }
        BOOST_TEST(got == named(s), name << " rank " << r << " swap " << i);
        rejected += !got.empty();
        ++tried;
      }
  }
  BOOST_TEST(rejected > 0);
  BOOST_TEST(rejected < tried);
}

BOOST_AUTO_TEST_CASE(an_action_on_the_wrong_rank_is_rejected) {
  PipelineSchedule s = make_schedule("Interleaved1F1B", 2, 2, 2);
  s.ranks[0].push_back({ActionType::kBackwardWeight, 1, 0});
  expect_rejected(s, "rank 0, action 1W0: stage 1 does not live on this rank");
}

BOOST_AUTO_TEST_CASE(action_strings_round_trip) {
  const PipelineSchedule s = make_schedule("ZBVZeroBubble", 3, 6, 2);
  for (const auto& list : s.ranks)
    for (const Action& a : list) BOOST_TEST((parse_action(to_string(a)) == a), to_string(a));
  BOOST_TEST(to_string(parse_action("12SEND_B31")) == "12SEND_B31");
  BOOST_CHECK_THROW(parse_action("F3"), ScheduleError);
  BOOST_CHECK_THROW(parse_action("0X3"), ScheduleError);
  BOOST_CHECK_THROW(parse_action("0F"), ScheduleError);
}

BOOST_AUTO_TEST_CASE(the_timeline_shows_one_column_per_slot) {
  const PipelineSchedule s = make_schedule("1F1B", 2, 2, 1);
  const std::string text = format_timeline(simulate_schedule(s));
  // F = 1, B = 2: rank 0 runs F0 F1 and waits for each gradient from rank 1's B.
  BOOST_TEST(text.find("rank 0  0F0 0F1 .   .   0B0 0B0 .   0B1 0B1\n") != std::string::npos, text);
  BOOST_TEST(text.find("rank 1  .   1F0 1B0 1B0 1F1 1B1 1B1 .   .\n") != std::string::npos, text);
}

BOOST_AUTO_TEST_CASE(csv_round_trips_a_generated_schedule) {
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
           {"1F1B", 1}, {"Interleaved1F1B", 2}, {"InterleavedZeroBubble", 2}, {"ZBVZeroBubble", 2}}) {
    const PipelineSchedule s = make_schedule(name, 4, 8, v);
    for (bool comm : {true, false}) {
      const PipelineSchedule back = parse_schedule_csv(write_schedule_csv(s, comm), "gen.csv", v, s.placement);
      BOOST_TEST(back.pp == s.pp);
      BOOST_TEST(back.microbatches == s.microbatches);
      BOOST_TEST((back.ranks == s.ranks), name << (comm ? " with" : " without") << " communication");
    }
  }
}

BOOST_AUTO_TEST_CASE(csv_errors_name_file_line_and_action) {
  // Hand-written GPipe on 2 ranks, comments and blanks allowed, communication derived.
  const PipelineSchedule ok = parse_schedule_csv("# rank 0\n0F0, 0F1, 0B0, 0B1\n\n1F0,1F1,1B0,1B1\n", "h.csv", 1,
                                                 StagePlacement::kLoop);
  BOOST_TEST(ok.microbatches == 2);
  BOOST_TEST(simulate_schedule(ok).bubble_fraction() == 0.5, boost::test_tools::tolerance(1e-12));
  auto rejects = [](const std::string& text, const std::string& part) {
    try {
      parse_schedule_csv(text, "h.csv", 1, StagePlacement::kLoop);
      BOOST_ERROR("accepted: " + text);
    } catch (const ScheduleError& e) {
      BOOST_TEST_INFO(e.what());
      BOOST_TEST(std::string(e.what()).find(part) != std::string::npos);
    }
  };
  rejects("0F0,0B0\n1F0,1X0,1B0\n", "h.csv:2: rank 1: action '1X0': unknown action type 'X'");
  rejects("0F0,0F1,0B0,0B1\n1F0,1F1,1B1\n", "h.csv: rank 1: 1B0 (or 1I0) is missing");
  rejects("0F0,0B0\n1B0,1F0\n", "h.csv: rank 1, action 1B0: runs before 1F0");
}

// TorchTitan's generate_llm_fqn_per_model_part, worked by hand: 6 blocks + 1 + 1 = 8 effective
// layers; 2 stages of 4 (embedding + 3, 3 + head); 4 stages of 2; 3 stages of 3, 3, 2 (the first
// stages take the remainder).
BOOST_AUTO_TEST_CASE(stage_split_follows_torchtitan) {
  auto text = [](const std::vector<StageLayers>& v) {
    std::string out;
    for (const StageLayers& s : v) out += (out.empty() ? "" : " | ") + describe(s);
    return out;
  };
  BOOST_TEST(text(split_stages(1, 6, 1, 1)) == "embedding + layers 0-5 + norm/output");
  BOOST_TEST(text(split_stages(2, 6, 1, 1)) == "embedding + layers 0-2 | layers 3-5 + norm/output");
  BOOST_TEST(text(split_stages(4, 6, 1, 1)) == "embedding + layer 0 | layers 1-2 | layers 3-4 | layer 5 + norm/output");
  BOOST_TEST(text(split_stages(3, 6, 1, 1)) == "embedding + layers 0-1 | layers 2-4 | layer 5 + norm/output");
  BOOST_TEST(text(split_stages(8, 6, 1, 1)) ==
             "embedding | layer 0 | layer 1 | layer 2 | layer 3 | layer 4 | layer 5 | norm/output");
  // Weights 0: the embedding and head ride along with blocks (6 over 2: 3 + 3).
  BOOST_TEST(text(split_stages(2, 6, 0, 0)) == "embedding + layers 0-2 | layers 3-5 + norm/output");
  // 126 blocks over 8 stages (Llama 3 405B recipe): 128 effective, 16 each.
  const auto big = split_stages(8, 126, 1, 1);
  BOOST_TEST(big.front().num_layers == 15);
  BOOST_TEST(big[1].num_layers == 16);
  BOOST_TEST(big.back().num_layers == 15);
  auto rejects = [](auto fn, const std::string& part) {
    try {
      fn();
      BOOST_ERROR("accepted, expected: " + part);
    } catch (const ScheduleError& e) {
      BOOST_TEST_INFO(e.what());
      BOOST_TEST(std::string(e.what()).find(part) != std::string::npos);
    }
  };
  rejects([] { split_stages(9, 6, 1, 1); }, "pipeline_parallel_degree: 9 stages for 8 effective layers");
  rejects([] { split_stages(4, 6, 3, 1); }, "pipeline_parallel_first_stage_less_layers = 3 exceeds the 2 layers");
  rejects([] { split_stages(4, 6, 1, 3); }, "pipeline_parallel_last_stage_less_layers = 3 exceeds the 2 layers");
  // Stages per rank: 1 / 2 by default; from layers_per_stage ⌈8 / K⌉ stages in all.
  BOOST_TEST(stages_per_rank_for("1F1B", 2, 6, 0, 1, 1) == 1);
  BOOST_TEST(stages_per_rank_for("Interleaved1F1B", 2, 6, 0, 1, 1) == 2);
  BOOST_TEST(stages_per_rank_for("Interleaved1F1B", 2, 6, 1, 1, 1) == 4);
  BOOST_TEST(stages_per_rank_for("1F1B", 2, 6, 4, 1, 1) == 1);
  rejects([] { stages_per_rank_for("1F1B", 2, 6, 3, 1, 1); }, "layers_per_stage = 3: 6 layers + 1 + 1");
  rejects([] { stages_per_rank_for("1F1B", 2, 6, 2, 1, 1); }, "4 stages of at most 2, 2 per rank, but 1F1B runs one");
  rejects([] { stages_per_rank_for("Interleaved1F1B", 2, 6, 4, 1, 1); }, "needs at least two stages per rank");
  rejects([] { stages_per_rank_for("ZBVZeroBubble", 2, 6, 1, 1, 1); }, "ZBVZeroBubble runs exactly two");
}
