#define BOOST_TEST_MODULE checkpoint_nonfinite
// The save path's second line of defence on 2 ranks (FSDP): a checkpoint whose parameters or
// AdamW moments hold a NaN or inf on any rank is refused on every rank with NonFiniteError naming
// the dataset and the element's global index, and its .tmp file is deleted, so nothing poisoned
// can be published; once the value is finite again the same save succeeds. The staging step of
// asynchronous saves refuses the same way, and what it staged is what gets written.
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <limits>
#include <string>

#include "checkpoint/sharded_checkpoint.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "mpi/mpi_fixture.hpp"
#include "optim/adamw.hpp"
#include "parallel/fsdp/sharded_data_parallel.hpp"
#include "tiny_model.hpp"
#include "util/errors.hpp"

using namespace meshtrain;

using testing::MpiFixture;
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

struct Setup {
  MpiCommunicator world{MPI_COMM_WORLD, "world"};
  std::unique_ptr<Device> dev = make_device("cpu", 1);
  Transformer model{testing::tiny_model_args(), *dev, model_storage_for(3)};
  ShardedDataParallel sdp{model, *dev, world, nullptr, ShardedOptions{3, true}};
  OptimizerSection ocfg;
  std::unique_ptr<AdamW> opt;
  std::string dir;

  Setup() {
    sdp.init_weights(3);
    opt = std::make_unique<AdamW>(sdp.local_shards(), *dev, ocfg);
    dir = (std::filesystem::temp_directory_path() / "meshtrain_test_checkpoint_nonfinite").string();
    if (world.rank() == 0) {  // a fresh folder: files an earlier run (or test case) left would pass as new
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
    }
    world.barrier();
  }

  // Writes element `k` of `t` (host memory on the cpu device).
  void poke(const Tensor& t, int64_t k, float v) { dev->upload(t.view({1}, k), &v, sizeof v); }

  // save_checkpoint into dir/name.tmp; returns the error text ("" on success) and whether the
  // error was a NonFiniteError.
  std::pair<std::string, bool> save(const std::string& name) {
    const std::string tmp = dir + "/" + name + ".tmp";
    try {
      save_checkpoint(tmp, world.comm(), *dev, model, sdp.local_shards(), *opt, TrainState{7, 0, 0, 0, 0.0, 3, {}},
                      CheckpointRole{}, CheckpointMeta{"", "test", world.size(), 8, false});
    } catch (const NonFiniteError& e) {
      return {e.what(), true};
    } catch (const CheckpointError& e) {
      return {e.what(), false};
    }
    return {"", false};
  }
};

// The shard of `name` on rank 1 (the poisoned rank), and its first element.
const LocalShard& shard_on(const ShardedDataParallel& sdp, const std::string& name) {
  for (const LocalShard& ls : sdp.local_shards())
    if (ls.param->name == name) return ls;
  throw std::logic_error("no shard of " + name);
}

}  // namespace

BOOST_AUTO_TEST_CASE(nonfinite_parameter_is_refused_everywhere_and_nothing_is_left) {
  Setup s;
  BOOST_TEST_REQUIRE(s.world.size() == 2);
  const std::string name = "layers.1.feed_forward.w2.weight";
  const LocalShard& ls = shard_on(s.sdp, name);
  BOOST_TEST_REQUIRE(ls.value.numel() > 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (s.world.rank() == 1) s.poke(ls.value, 3, nan);
  const auto [err, nonfinite] = s.save("param");
  BOOST_TEST_INFO("error: " << err);
  BOOST_TEST(nonfinite);  // every rank throws the same kind, not only the one holding the NaN
  BOOST_TEST(err.find("refusing to publish") != std::string::npos);
  BOOST_TEST(err.find("/model/" + name + "[") != std::string::npos);
  BOOST_TEST(err.find("nan") != std::string::npos);
  s.world.barrier();
  BOOST_TEST(!std::filesystem::exists(s.dir + "/param.tmp"));

  if (s.world.rank() == 1) s.poke(ls.value, 3, 0.25f);  // finite again: the save goes through
  const auto [ok, nf2] = s.save("param");
  BOOST_TEST(ok.empty(), ok);
  BOOST_TEST(!nf2);
  s.world.barrier();
  BOOST_TEST(std::filesystem::exists(s.dir + "/param.tmp"));
}

BOOST_AUTO_TEST_CASE(nonfinite_optimizer_moment_is_refused) {
  Setup s;
  const std::string name = "tok_embeddings.weight";
  size_t idx = 0;
  for (; idx < s.sdp.local_shards().size(); ++idx)
    if (s.sdp.local_shards()[idx].param->name == name) break;
  BOOST_TEST_REQUIRE(idx < s.sdp.local_shards().size());
  const int64_t n = s.sdp.local_shards()[idx].value.numel();
  if (s.world.rank() == 0) s.poke(s.opt->exp_avg_sq().view({n}, s.opt->offset(idx)), 0, std::numeric_limits<float>::infinity());
  const auto [err, nonfinite] = s.save("moment");
  BOOST_TEST_INFO("error: " << err);
  BOOST_TEST(nonfinite);
  BOOST_TEST(err.find("/optimizer/" + name + "/exp_avg_sq[") != std::string::npos);
  BOOST_TEST(err.find("inf") != std::string::npos);
  s.world.barrier();
  BOOST_TEST(!std::filesystem::exists(s.dir + "/moment.tmp"));
}

// Asynchronous saves stage the state first: a NaN is refused at staging, on every rank, before
// any file exists; a staged snapshot is written as it was when staged, whatever training does to
// the live tensors meanwhile (what lets a background thread write it).
BOOST_AUTO_TEST_CASE(staging_refuses_nonfinite_and_the_snapshot_is_isolated) {
  Setup s;
  BOOST_TEST_REQUIRE(s.world.size() == 2);
  const std::string name = "layers.0.attention.wq.weight";
  const LocalShard& ls = shard_on(s.sdp, name);
  BOOST_TEST_REQUIRE(ls.value.numel() > 3);
  const std::string path = s.dir + "/staged.tmp";
  auto plan = [&] {
    return plan_checkpoint(s.model, s.sdp.local_shards(), *s.opt, TrainState{7, 0, 0, 0, 0.0, 3, {}}, CheckpointRole{},
                           CheckpointMeta{"", "test", s.world.size(), 8, false});
  };
  if (s.world.rank() == 1) s.poke(ls.value, 3, std::numeric_limits<float>::quiet_NaN());
  CheckpointSnapshot bad = plan();
  std::string err;
  try {
    stage_checkpoint(bad, s.world.comm(), path, *s.dev, nullptr);
  } catch (const NonFiniteError& e) {
    err = e.what();
  }
  BOOST_TEST_INFO("error: " << err);
  BOOST_TEST(err.find("refusing to publish") != std::string::npos);  // on every rank
  BOOST_TEST(err.find("/model/" + name + "[") != std::string::npos);
  s.world.barrier();
  BOOST_TEST(!std::filesystem::exists(path));

  if (s.world.rank() == 1) s.poke(ls.value, 3, 0.25f);
  CheckpointSnapshot snap = plan();
  stage_checkpoint(snap, s.world.comm(), path, *s.dev, &bad);  // reuses the refused snapshot's buffers
  BOOST_TEST(snap.staged);
  s.poke(ls.value, 3, 123.0f);  // training goes on after staging
  write_checkpoint(path, s.world.comm(), snap, nullptr);
  s.world.barrier();
  load_checkpoint(path, s.world.comm(), *s.dev, s.model, s.sdp.local_shards(), *s.opt);
  float v = 0;
  s.dev->download(&v, ls.value.view({1}, 3), sizeof v);
  BOOST_TEST(v != 123.0f);  // every rank reads back what it staged, not the later value
  if (s.world.rank() == 1) BOOST_TEST(v == 0.25f);
}
