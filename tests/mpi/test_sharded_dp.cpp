#define BOOST_TEST_MODULE sharded_data_parallel
// ShardedDataParallel on 3 ranks (shapes 3 does not divide, a tied output projection, and
// q_norm / k_norm with fewer rows than ranks) against a replicated model on the same rank:
// gathered parameters equal the replicated initialization bitwise, and after every rank ran the
// same micro-batches each rank's gradient shard equals its rows of 3 × the replicated gradient.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>

#include "comm/mpi/mpi_communicator.hpp"
#include "config/float8_config.hpp"
#include "model/float8_linears.hpp"
#include "mpi/mpi_fixture.hpp"
#include "parallel/fsdp/sharded_data_parallel.hpp"
#include "tensor/float8.hpp"
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

// The FP8 all-gather of Float8 weights (enable_fsdp_float8_all_gather, TorchAO's float8 FSDP
// all-gather) on 3 ranks, tensorwise, float32: the gathered weights are the tensorwise cast of the
// whole weights bit for bit, gradients after two micro-batches equal the float32 gather's bit for
// bit, and the all-gathers moved 1 byte per element of those weights (4 for the norms).
BOOST_AUTO_TEST_CASE(float8_all_gather_moves_e4m3_codes_and_changes_nothing) {
  MpiCommunicator world(MPI_COMM_WORLD, "fsdp");
  auto dev = make_device("cpu", 1);
  const ModelArgs a = testing::tiny_model_args();  // linears' extents are multiples of 16: all convert
  Float8Config f8;
  f8.enabled = f8.emulate = true;
  f8.filter_fqns = {"output"};
  ShardedOptions hp_opt{3, true}, f8_opt{3, true};
  f8_opt.float8_all_gather = true;

  Transformer ref(a, *dev);
  ref.init_weights(5);
  {  // the gathered values of block 0's Float8 weights
    Transformer m(a, *dev, model_storage_for(3));
    BOOST_TEST_REQUIRE(!convert_float8_linears(m, f8).empty());
    ShardedDataParallel sdp(m, *dev, world, nullptr, f8_opt);
    sdp.init_weights(5);
    sdp.set_micro_batch_role(true, true);
    sdp.pre_forward(1, 0);
    int checked = 0;
    for (Parameter* p : m.parameters()) {
      if (!p->float8 || !p->value.defined() || p->name.rfind("layers.0.", 0) != 0) continue;
      const Tensor& r = ref.find(p->name)->value;
      Tensor want = dev->empty({r.dim(0), r.numel() / r.dim(0)}, DType::kF32, MemCategory::kTemporaries);
      dev->float8_cast(r.reshape(want.shape()), p->float8->output_w, p->float8->power_of_two, want);
      BOOST_TEST_CONTEXT(p->name) { BOOST_TEST(std::memcmp(p->value.raw(), want.raw(), want.nbytes()) == 0); }
      ++checked;
    }
    BOOST_TEST(checked == 7);  // wq, wk, wv, wo, w1, w2, w3
  }

  std::vector<std::vector<float>> grads[2];
  int64_t gather_bytes[2];
  // Per micro-batch each unit is gathered for its forward and its backward, but the last,
  // kept from its forward to its backward; an all-gather counts (N − 1) · the block's bytes.
  int64_t want_bytes[2] = {0, 0}, f8_elems = 0, all_elems = 0;
  for (int run = 0; run < 2; ++run) {
    Transformer m(a, *dev, model_storage_for(3));
    convert_float8_linears(m, f8);
    ShardedDataParallel sdp(m, *dev, world, nullptr, run ? f8_opt : hp_opt);
    sdp.init_weights(5);
    const int64_t before = world.bytes_sent()[int(CollectiveKind::kAllGather)];
    m.zero_grad();
    run_micro_batches(m, &sdp, 2);
    gather_bytes[run] = world.bytes_sent()[int(CollectiveKind::kAllGather)] - before;
    for (const LocalShard& ls : sdp.local_shards())
      grads[run].emplace_back(ls.grad.f32(), ls.grad.f32() + ls.grad.numel());
    if (run == 0)
      for (size_t f = 0; f < sdp.plan().units.size(); ++f) {
        const int64_t times = 2 * (f + 1 == sdp.plan().units.size() ? 1 : 2);
        for (const ShardedParam& sp : sdp.plan().units[f].params) {
          const int64_t n = align16(sp.shard.padded_elems());
          want_bytes[0] += times * (world.size() - 1) * 4 * n;
          want_bytes[1] += times * (world.size() - 1) * (sp.param->float8 ? 1 : 4) * n;
          all_elems += n;
          if (sp.param->float8) f8_elems += n;
        }
      }
  }
  BOOST_TEST_REQUIRE(grads[0].size() == grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i)
    BOOST_TEST(std::memcmp(grads[0][i].data(), grads[1][i].data(), grads[0][i].size() * sizeof(float)) == 0);
  BOOST_TEST(f8_elems > all_elems / 2);
  BOOST_TEST(gather_bytes[0] == want_bytes[0]);
  BOOST_TEST(gather_bytes[1] == want_bytes[1]);
}

BOOST_AUTO_TEST_CASE(rejects_a_model_with_the_wrong_storage) {
  MpiCommunicator world(MPI_COMM_WORLD, "fsdp");
  auto dev = make_device("cpu", 1);
  Transformer replicated(uneven_args(), *dev);
  BOOST_CHECK_THROW(ShardedDataParallel(replicated, *dev, world, nullptr, ShardedOptions{3, true}), std::invalid_argument);
  BOOST_CHECK_THROW(ShardedDataParallel(replicated, *dev, world, nullptr, ShardedOptions{4, true}), std::invalid_argument);
}
