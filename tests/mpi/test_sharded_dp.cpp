#define BOOST_TEST_MODULE sharded_data_parallel
// ShardedDataParallel on 3 ranks (shapes 3 does not divide, a tied output projection, and
// q_norm / k_norm with fewer rows than ranks) against a replicated model on the same rank:
// gathered parameters equal the replicated initialization bitwise, and after every rank ran the
// same micro-batches each rank's gradient shard equals its rows of 3 × the replicated gradient.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>

#include "comm/mpi/mpi_communicator.hpp"
#include "mpi/mpi_fixture.hpp"
#include "parallel/fsdp/sharded_data_parallel.hpp"
#include "tiny_model.hpp"

using namespace meshtrain;

namespace {

ModelArgs uneven_args() {
  ModelArgs a = testing::tiny_model_args(20, 2, 10, 2, 47);  // dim 20, head_dim 2 (< 3 ranks), vocab 47
  a.qk_norm = true;
  a.tie_word_embeddings = true;
  return a;
}

std::vector<int32_t> batch(int64_t n, int64_t t, int64_t vocab, int salt) {
  std::vector<int32_t> s(size_t(n * (t + 1)));
  for (size_t i = 0; i < s.size(); ++i) s[i] = int32_t((i * 7 + size_t(salt) * 13) % size_t(vocab));
  return s;
}

// Runs `accum` micro-batches forward + backward through `hooks` (none: the replicated model).
void run_micro_batches(Transformer& m, GradientSync* sync, int64_t accum) {
  Executor exec(m.units(), m.block_index(), CheckpointPolicy{});
  if (sync) exec.set_hooks(sync);
  for (int64_t k = 0; k < accum; ++k) {
    const auto s = batch(2, 8, m.args().vocab_size, int(k));
    StepContext ctx = m.make_context(s.data(), 2, 8, 0.01f, true);
    if (sync) sync->begin_micro_batch(k, accum);
    exec.forward_backward(ctx);
  }
  if (sync) sync->finish_gradients();
}

void check_stage(int stage, int64_t accum) {
  MpiCommunicator world(MPI_COMM_WORLD, "fsdp");
  BOOST_TEST_REQUIRE(world.size() == 3);
  auto dev = make_device("cpu", 1);
  const ModelArgs a = uneven_args();
  Transformer ref(a, *dev);
  ref.init_weights(5);
  Transformer m(a, *dev, model_storage_for(stage));
  ShardedDataParallel sdp(m, *dev, world, nullptr, ShardedOptions{stage, true});
  sdp.init_weights(5);

  sdp.gather_full_parameters();
  for (Parameter* p : ref.parameters()) {
    const Parameter* q = m.find(p->name);
    BOOST_TEST_CONTEXT("ZeRO-" << stage << " " << p->name) {
      BOOST_TEST_REQUIRE(q->value.numel() == p->value.numel());
      BOOST_TEST(std::memcmp(q->value.raw(), p->value.raw(), p->value.nbytes()) == 0);
    }
  }
  sdp.release_full_parameters();

  ref.zero_grad();
  run_micro_batches(ref, nullptr, accum);
  m.zero_grad();
  run_micro_batches(m, &sdp, accum);
  size_t checked = 0;
  for (const LocalShard& ls : sdp.local_shards()) {
    const Parameter* p = ref.find(ls.param->name);
    const Dim0Shard s = dim0_shard(p->shape, 3, world.rank());
    const float* want = p->grad.f32() + s.first_row * s.row_elems;
    BOOST_TEST_CONTEXT("ZeRO-" << stage << " accum " << accum << " " << p->name) {
      BOOST_TEST_REQUIRE(ls.grad.numel() == s.local_elems());
      for (int64_t i = 0; i < ls.grad.numel(); ++i) {
        const double w = 3.0 * want[i], g = ls.grad.f32()[i];
        BOOST_TEST(std::abs(g - w) <= 1e-5 * (std::abs(w) + 1e-3), i << ": " << g << " vs " << w);
      }
    }
    checked += size_t(ls.grad.numel() > 0);
  }
  BOOST_TEST(checked > 0u);
}

}  // namespace

using testing::MpiFixture;
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

BOOST_AUTO_TEST_CASE(fsdp_gathers_exactly_and_reduce_scatters_sums) {
  check_stage(3, 1);
  check_stage(3, 2);
}

BOOST_AUTO_TEST_CASE(zero1_and_zero2_shard_gradients) {
  check_stage(1, 2);
  check_stage(2, 2);
}

BOOST_AUTO_TEST_CASE(rejects_a_model_with_the_wrong_storage) {
  MpiCommunicator world(MPI_COMM_WORLD, "fsdp");
  auto dev = make_device("cpu", 1);
  Transformer replicated(uneven_args(), *dev);
  BOOST_CHECK_THROW(ShardedDataParallel(replicated, *dev, world, nullptr, ShardedOptions{3, true}), std::invalid_argument);
  BOOST_CHECK_THROW(ShardedDataParallel(replicated, *dev, world, nullptr, ShardedOptions{4, true}), std::invalid_argument);
}
