#define BOOST_TEST_MODULE trace_fsdp
// The instrumentation on 2 ranks: one ZeRO-3 step with full activation checkpointing and
// tracing on records, on every rank, the executor's forward / recompute / backward span of every
// unit, the strategy's issue and wait spans of its all-gathers and reduce-scatters, and the
// collectives' async issue-to-completion intervals; the Chrome trace of it is a valid document
// whose spans nest per thread. A step with tracing off records nothing.
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "comm/mpi/mpi_communicator.hpp"
#include "metrics/chrome_trace.hpp"
#include "mpi/mpi_fixture.hpp"
#include "parallel/fsdp/sharded_data_parallel.hpp"
#include "scratch_dir.hpp"
#include "tiny_model.hpp"
#include "util/trace.hpp"

using namespace meshtrain;
using nlohmann::json;
namespace fs = std::filesystem;

using meshtrain::testing::MpiFixture;
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

void one_step(Transformer& m, ShardedDataParallel& sdp, Executor& exec) {
  std::vector<int32_t> s(2 * 9);
  for (size_t i = 0; i < s.size(); ++i) s[i] = int32_t((i * 7) % size_t(m.args().vocab_size));
  StepContext ctx = m.make_context(s.data(), 2, 8, 0.01f, true);
  sdp.begin_micro_batch(0, 1);
  exec.forward_backward(ctx);
  sdp.finish_gradients();
}

// Complete events of one thread must nest: each starts after its predecessor ended or ends
// within it (what the Trace Event Format requires of "X" events on one thread).
bool nests(std::vector<json> xs) {
  std::sort(xs.begin(), xs.end(), [](const json& a, const json& b) {
    return a["ts"] != b["ts"] ? a["ts"].get<double>() < b["ts"].get<double>()
                              : a["dur"].get<double>() > b["dur"].get<double>();
  });
  std::vector<double> open_ends;
  for (const json& x : xs) {
    const double ts = x["ts"], end = ts + x["dur"].get<double>();
    while (!open_ends.empty() && open_ends.back() <= ts) open_ends.pop_back();
    if (!open_ends.empty() && end > open_ends.back()) return false;
    open_ends.push_back(end);
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(zero3_step_with_full_recompute) {
  MpiCommunicator world(MPI_COMM_WORLD, "dp_shard");
  BOOST_TEST_REQUIRE(world.size() == 2);
  auto dev = make_device("cpu", 1);
  const ModelArgs a = testing::tiny_model_args(16, 2, 2, 1, 40);
  Transformer m(a, *dev, model_storage_for(3));
  ShardedDataParallel sdp(m, *dev, world, nullptr, ShardedOptions{3, true});
  sdp.init_weights(3);
  CheckpointPolicy full;
  full.mode = CheckpointPolicy::Mode::kFull;
  Executor exec(m.units(), m.block_index(), full);
  exec.set_hooks(&sdp);

  trace::take();
  one_step(m, sdp, exec);  // tracing off
  BOOST_TEST(trace::take().events.empty());

  trace::enable(true);
  one_step(m, sdp, exec);
  trace::enable(false);
  const trace::Recording rec = trace::take();

  const fs::path dir = meshtrain::testing::scratch_dir("meshtrain_test_trace_fsdp");  // this rank's, removed at exit
  const std::string path = write_chrome_trace(dir.string(), 1, world.rank(), rec);
  std::ifstream f(path);
  const json doc = json::parse(f);

  std::map<std::string, std::multiset<std::string>> by_cat;  // category -> names
  std::map<int64_t, std::vector<json>> complete_by_tid;
  std::map<std::string, int> async_begins;
  for (const json& e : doc["traceEvents"]) {
    BOOST_TEST(e["pid"] == world.rank());
    if (e["ph"] == "X") {
      by_cat[e["cat"]].insert(e["name"].get<std::string>());
      complete_by_tid[e["tid"]].push_back(e);
      if (e["cat"] == "comm_issue") {
        BOOST_TEST(e["args"]["bytes"].get<int64_t>() > 0);
        BOOST_TEST(e["args"]["group"] == "dp_shard");
        BOOST_TEST(e["args"].contains("unit"));
      }
    }
    if (e["ph"] == "b") ++async_begins[e["name"]];
  }

  std::multiset<std::string> units, blocks;
  for (size_t u = 0; u < m.units().size(); ++u) {
    units.insert(m.units()[u]->name());
    if (m.block_index()[u] >= 0) blocks.insert(m.units()[u]->name());
  }
  BOOST_TEST(by_cat["forward"] == units);
  BOOST_TEST(by_cat["backward"] == units);
  BOOST_TEST(by_cat["recompute"] == blocks);  // every block, not the embedding or the head
  BOOST_TEST(by_cat["comm_issue"].count("issue all_gather") > 0);
  BOOST_TEST(by_cat["comm_issue"].count("issue reduce_scatter") == sdp.plan().units.size());
  BOOST_TEST(by_cat["comm_wait"].count("wait all_gather") > 0);
  for (const auto& [tid, xs] : complete_by_tid) BOOST_TEST(nests(xs), "thread " << tid);
  // MpiCommunicator: every all-gather and reduce-scatter as an async interval, and the blocking
  // waits inside the strategy's wait spans (nesting checked above).
  BOOST_TEST(async_begins["all_gather"] == int(by_cat["comm_issue"].count("issue all_gather")));
  BOOST_TEST(async_begins["reduce_scatter"] == int(sdp.plan().units.size()));
  BOOST_TEST(by_cat["comm_wait"].count("all_gather") > 0);
}
