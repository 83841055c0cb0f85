#define BOOST_TEST_MODULE mixed_precision_instances
// bf16 compute copies under two FSDP instances over disjoint parameters (expert parallelism's
// ComposedGradientSync: routed experts in one instance, everything else in the other), on 2 CPU
// ranks. The CPU device cannot run a bf16 forward, but it casts and gathers bf16, so this drives
// the executor's hook sequence by hand (pre_forward → ensure_compute → post_forward over every
// unit, then the same in backward order, a validation pass and a full-precision gather between
// steps) and checks after every ensure_compute that each
// parameter the unit reads has a bound compute copy equal, bit for bit, to the bf16 rounding of
// the replicated model's value — with f32 gathers (the model casts) and bf16 gathers (the
// gathered values are the copies), resharding after forward or not. One instance's reshard
// must not unbind, or mark stale, the other instance's copies.
#include <boost/test/unit_test.hpp>

#include <memory>

#include "comm/mpi/mpi_communicator.hpp"
#include "mpi/mpi_fixture.hpp"
#include "parallel/composed_sync.hpp"
#include "parallel/fsdp/sharded_data_parallel.hpp"
#include "tensor/bf16.hpp"
#include "tiny_model.hpp"

using namespace meshtrain;

namespace {

// Two blocks: the first dense, the second MoE with 4 routed experts and a shared expert.
ModelArgs moe_args() {
  ModelArgs a = testing::tiny_model_args(16, 2, 2, 2, 40);
  a.num_experts = 4;
  a.top_k = 2;
  a.moe_inter_dim = 8;
  a.num_shared_experts = 1;
  a.n_dense_layers = 1;
  return a;
}

bool is_routed_expert(const Parameter& p) { return p.name.find(".experts.") != std::string::npos; }

// Every parameter unit u reads has a compute copy equal to bf16(ref value).
void check_unit(Transformer& m, const Transformer& ref, size_t u, const std::string& when) {
  for (Parameter* p : m.unit_parameters(u)) {
    BOOST_TEST_CONTEXT(when << ", unit " << u << ", " << p->name) {
      BOOST_TEST_REQUIRE(p->compute.defined());
      BOOST_TEST_REQUIRE(p->compute.numel() == shape_numel(p->local_shape));
      const Parameter* q = ref.find(p->name);
      const float* want = q->value.f32();
      const uint16_t* got = p->compute.bf16();
      int64_t wrong = 0;
      for (int64_t i = 0; i < p->compute.numel(); ++i) wrong += got[i] != bf16_from_float(want[i]);
      BOOST_TEST(wrong == 0);
    }
  }
}

void run(DType param_dtype, bool reshard_after_forward) {
  MpiCommunicator world(MPI_COMM_WORLD, "fsdp");
  BOOST_TEST_REQUIRE(world.size() == 2);
  auto dev = make_device("cpu", 1);
  const ModelArgs a = moe_args();
  Transformer ref(a, *dev);
  ref.init_weights(11);
  Transformer m(a, *dev, model_storage_for(3), {}, DType::kBF16);

  ShardedOptions dense_opt{3, reshard_after_forward};
  dense_opt.param_dtype = param_dtype;
  dense_opt.select = [](const Parameter& p) { return !is_routed_expert(p); };
  ShardedOptions expert_opt = dense_opt;
  expert_opt.select = [](const Parameter& p) { return is_routed_expert(p); };
  auto dense = std::make_unique<ShardedDataParallel>(m, *dev, world, nullptr, dense_opt);
  auto experts = std::make_unique<ShardedDataParallel>(m, *dev, world, nullptr, expert_opt);
  dense->init_weights(11);
  experts->init_weights(11);
  BOOST_TEST_REQUIRE(!experts->local_shards().empty());
  std::vector<std::unique_ptr<GradientSync>> parts;
  parts.push_back(std::move(dense));
  parts.push_back(std::move(experts));
  ComposedGradientSync sync(std::move(parts));

  const std::string mode = std::string(param_dtype == DType::kBF16 ? "bf16" : "f32") + " gathers, reshard " +
                           (reshard_after_forward ? "after forward" : "never");
  const size_t units = m.units().size();
  for (int step = 0; step < 2; ++step) {
    sync.begin_micro_batch(0, 1);
    for (size_t u = 0; u < units; ++u) {
      sync.pre_forward(u, 0);
      m.ensure_compute(u);
      check_unit(m, ref, u, mode + ", forward");
      sync.post_forward(u, 0);
    }
    for (size_t u = units; u-- > 0;) {
      sync.pre_backward(u, 0);
      m.ensure_compute(u);
      check_unit(m, ref, u, mode + ", backward");
      sync.post_backward(u, 0);
    }
    sync.finish_gradients();
    // No optimizer step: the values stay those of ref, so every pass regathers the same.
    // Between steps: a validation pass (every unit released after its forward), and the f32
    // gather of a checkpoint save or dump (bf16 gathers are dropped and regathered in f32).
    sync.begin_evaluation();
    for (size_t u = 0; u < units; ++u) {
      sync.pre_forward(u, 0);
      m.ensure_compute(u);
      check_unit(m, ref, u, mode + ", evaluation");
      sync.post_forward(u, 0);
    }
    sync.gather_full_parameters();
    for (Parameter* p : m.parameters()) BOOST_TEST_REQUIRE(p->value.defined(), p->name);
    sync.release_full_parameters();
  }
}

}  // namespace

using meshtrain::testing::MpiFixture;
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

BOOST_AUTO_TEST_CASE(f32_gathers_cast_both_instances_parameters) {
  run(DType::kF32, true);
  run(DType::kF32, false);
}

BOOST_AUTO_TEST_CASE(bf16_gathers_bind_both_instances_parameters) {
  run(DType::kBF16, true);
  run(DType::kBF16, false);
}
