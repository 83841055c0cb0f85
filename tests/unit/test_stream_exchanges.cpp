// Every point-to-point exchange the trainer posts, checked under the stream-ordered model of
// NCCL (parallel/pipeline/stream_order.hpp) on the CPU: the pipeline schedules' action lists
// (also in test_pp_schedule), validation's forward-only lists (which PipelineRuntime::evaluate
// runs) and, recorded from the real code with StreamRecorder, the tied embedding's gradient
// sum between the first and the last stage. The former tied exchange (a
// receive and a send posted as two calls on both ranks, which hangs Llama 3.2 1B / 3B and small
// Qwen3 under pp ≥ 2 on NCCL) is rejected by the same check.
#define BOOST_TEST_MODULE stream_exchanges
#include <boost/test/unit_test.hpp>

#include <memory>
#include <string>
#include <vector>

#include "parallel/grad_sync.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/stage_split.hpp"
#include "parallel/pipeline/stream_order.hpp"
#include "tiny_model.hpp"
#include "train/stage_parts.hpp"
#include "train/stream_recorder.hpp"

using namespace meshtrain;

namespace {

/// One pipeline rank of a tied tiny model: its part of stage `stage` of `num_stages`, one
/// stage per rank.
struct StageRank {
  std::unique_ptr<Device> dev = make_device("cpu", 1);
  std::unique_ptr<Transformer> model;
  std::vector<LocalShard> shards;
  StageRank(const ModelArgs& args, const std::vector<StageLayers>& split, int stage) {
    const ModelPart part = model_part_of(split, {stage});
    model = std::make_unique<Transformer>(args, *dev, ModelStorage{}, TensorParallel{}, DType::kF32, &part);
    shards = replicated_shards(*model);
  }
};

ModelArgs tied_args(int64_t layers) {
  ModelArgs a = testing::tiny_model_args(32, layers);
  a.tie_word_embeddings = true;
  return a;
}

/// Runs sum_tied_embedding_grads on every rank of a pp-stage pipeline (one stage per rank) on
/// recorders and returns the programs.
std::vector<StreamProgram> record_tied_sum(int pp) {
  const ModelArgs args = tied_args(2 * pp);
  const std::vector<StageLayers> split = split_stages(pp, args.n_layers, 1, 1);
  std::vector<StreamProgram> programs;
  for (int r = 0; r < pp; ++r) {
    StageRank rank(args, split, r);
    StreamRecorder rec(r, pp, "pp");
    sum_tied_embedding_grads(*rank.dev, *rank.model, rank.shards, rec, 0, pp - 1);
    programs.push_back(rec.program());
  }
  return programs;
}

std::string rejection(const std::vector<StreamProgram>& programs) {
  try {
    check_stream_programs(programs, "exchange");
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(tied_embedding_sum_completes_on_a_stream_ordered_backend) {
  for (int pp : {2, 3, 4}) {
    BOOST_TEST_CONTEXT("pp " << pp) {
      const std::vector<StreamProgram> programs = record_tied_sum(pp);
      BOOST_TEST(rejection(programs) == "");
      // The first and the last rank post one group of a receive and a send; the others nothing.
      for (int r = 0; r < pp; ++r) {
        const bool end = r == 0 || r == pp - 1;
        BOOST_TEST(programs[size_t(r)].size() == (end ? 3u : 0u));  // the group, then two waits
        if (end) BOOST_TEST(programs[size_t(r)][0].group.size() == 2u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_receive_then_a_send_as_two_calls_on_both_ranks_deadlocks) {
  // The tied exchange as it was: recv(); send(); wait both — on both ranks. MPI completes it;
  // on NCCL each rank's receive group waits for the peer's send group, queued behind it.
  std::vector<StreamProgram> programs;
  for (int r = 0; r < 2; ++r) {
    auto dev = make_device("cpu", 1);
    const Tensor grad = dev->empty({4, 8}, DType::kF32, MemCategory::kGradients);
    const Tensor theirs = dev->empty({4, 8}, DType::kF32, MemCategory::kCommunication);
    StreamRecorder rec(r, 2);
    auto recv = rec.recv(theirs, 1 - r, 0);
    auto send = rec.send(grad, 1 - r, 0);
    recv->wait();
    send->wait();
    programs.push_back(rec.program());
  }
  const std::string why = rejection(programs);
  BOOST_TEST(why.find("exchange deadlocks on a stream-ordered backend") != std::string::npos, why);
  BOOST_TEST(why.find("rank 0 at wait for recv from 1 (128 bytes, tag 0), communication group "
                      "[recv from 1 (128 bytes, tag 0)] waiting for its partners") != std::string::npos,
             why);
}

BOOST_AUTO_TEST_CASE(a_message_of_another_size_is_the_wrong_buffer) {
  std::vector<StreamProgram> programs;
  for (int r = 0; r < 2; ++r) {
    auto dev = make_device("cpu", 1);
    StreamRecorder rec(r, 2);
    const Tensor mine = dev->empty({r == 0 ? 4 : 5}, DType::kF32, MemCategory::kCommunication);
    const Tensor theirs = dev->empty({4}, DType::kF32, MemCategory::kCommunication);
    for (auto& w : rec.send_recv_batch({{true, mine, 1 - r, 0}, {false, theirs, 1 - r, 0}})) w->wait();
    programs.push_back(rec.program());
  }
  const std::string why = rejection(programs);
  BOOST_TEST(why.find("rank 1 → rank 0: message 0 is sent as 20 bytes, tag 0 but received as 16 bytes, tag 0") !=
                 std::string::npos,
             why);
}

BOOST_AUTO_TEST_CASE(the_recorder_refuses_collectives_and_foreign_peers) {
  auto dev = make_device("cpu", 1);
  const Tensor t = dev->empty({4}, DType::kF32, MemCategory::kCommunication);
  StreamRecorder rec(0, 2);
  BOOST_CHECK_THROW(rec.all_reduce(t, ReduceOp::kSum), std::logic_error);
  BOOST_CHECK_THROW(rec.send(t, 2, 0), std::invalid_argument);
  BOOST_CHECK_THROW(StreamRecorder(2, 2), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(schedules_run_through_the_same_model) {
  // The train step's exchanges: each generated schedule's programs, as PipelineRuntime posts them.
  for (const std::string& name : schedule_names()) {
    const int v = is_multi_stage(name) ? 2 : 1;
    const PipelineSchedule s = make_schedule(name, 4, 8, v);
    const std::vector<StreamProgram> programs = schedule_programs(s);
    BOOST_TEST(programs.size() == 4u);
    BOOST_TEST(rejection(programs) == "", name);
  }
}

BOOST_AUTO_TEST_CASE(validation_forward_lists_run_through_the_same_model) {
  // PipelineRuntime::evaluate runs forward_only_schedule()'s lists; every placement, v and pp.
  for (const std::string& name : schedule_names()) {
    for (int pp = 2; pp <= 6; ++pp) {
      const int v = name == "ZBVZeroBubble" ? 2 : is_multi_stage(name) ? 3 : 1;
      const PipelineSchedule s = make_schedule(name, pp, 2 * pp, v);
      const PipelineSchedule f = forward_only_schedule(s);
      BOOST_TEST_CONTEXT(name << " pp " << pp) {
        BOOST_TEST(rejection(schedule_programs(f)) == "");
        // Each stage runs once, and each rank's stages ascend.
        size_t forwards = 0;
        for (const auto& list : f.ranks)
          for (const Action& a : list) forwards += a.type == ActionType::kForward;
        BOOST_TEST(forwards == size_t(s.num_stages()));
      }
    }
  }
}
