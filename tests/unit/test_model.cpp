#define BOOST_TEST_MODULE model
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <vector>

#include "graph/executor.hpp"
#include "model/init.hpp"
#include "model/transformer.hpp"
#include "tiny_model.hpp"
#include "util/rng.hpp"

using namespace meshtrain;

namespace {

ModelArgs small_args() { return testing::tiny_model_args(); }

// One forward + backward; returns the loss sum and a copy of all gradients.
std::pair<double, std::vector<float>> run(Transformer& m, Device& d, CheckpointPolicy policy) {
  const int64_t b = 2, t = 8;
  StepContext ctx;
  ctx.dev = &d;
  ctx.batch = b;
  ctx.seq_len = t;
  ctx.shard = sequence_shard(t, 1, 0, CpBalancer::kHeadTail);  // the whole sequence
  ctx.tokens = d.empty({b * t}, DType::kI32, MemCategory::kActivations);
  ctx.targets = d.empty({b * t}, DType::kI32, MemCategory::kActivations);
  for (int64_t i = 0; i < b * t; ++i) {
    ctx.tokens.i32()[i] = int32_t(counter_u64(1, 2, uint64_t(i)) % 50);
    ctx.targets.i32()[i] = int32_t(counter_u64(1, 3, uint64_t(i)) % 50);
  }
  std::tie(ctx.rope_cos, ctx.rope_sin) = m.rope_tables(t);
  ctx.loss_grad_scale = 1.0f / float(b * t);
  std::vector<int64_t> blocks{-1};
  for (int i = 0; i < m.args().n_layers; ++i) blocks.push_back(i);
  blocks.push_back(-1);
  Executor exec(m.units(), blocks, policy);
  m.zero_grad();
  exec.forward_backward(ctx);
  const Tensor& g = m.flat_grads();
  return {ctx.loss_sum, std::vector<float>(g.f32(), g.f32() + g.numel())};
}

}  // namespace

BOOST_AUTO_TEST_CASE(parameter_count_matches_formula) {
  for (bool tie : {false, true})
    for (bool qk : {false, true}) {
      ModelArgs a = small_args();
      a.tie_word_embeddings = tie;
      a.qk_norm = qk;
      auto d = make_device("cpu", 1);
      Transformer m(a, *d);
      int64_t n = 0;
      for (Parameter* p : m.parameters()) n += p->value.numel();
      BOOST_TEST(n == a.num_params());
      BOOST_TEST((m.find("output.weight") == nullptr) == tie);
      BOOST_TEST((m.find("layers.0.attention.q_norm.weight") != nullptr) == qk);
    }
}

// FLOPs per token count the output projection even when it is tied (it is still a matmul):
// Llama 3.2 1B (tied) at seq_len 2048 is 8.22 GFLOP/token; without the output projection, as
// counting the shared weights once would give, 6.64 GFLOP/token (19% lower).
BOOST_AUTO_TEST_CASE(flops_count_the_tied_output_projection) {
  const ModelArgs m = model_flavor("llama3", "1B");
  BOOST_TEST_REQUIRE(m.tie_word_embeddings);
  const double v = double(m.vocab_size) * double(m.dim);
  BOOST_TEST(double(m.matmul_params()) == double(m.num_params() - m.num_embedding_params()) + v);
  const double attention = 12.0 * 16 * 32 * 64 * 2048;
  BOOST_TEST(m.flops_per_token(2048) == 6.0 * double(m.matmul_params()) + attention);
  BOOST_TEST(std::abs(m.flops_per_token(2048) / 8.22e9 - 1.0) < 2e-3);
  BOOST_TEST(m.flops_per_token(2048) - m.flops_per_token_without_tied_output(2048) == 6.0 * v);
  ModelArgs untied = m;
  untied.tie_word_embeddings = false;  // untied: the output projection is its own parameter
  BOOST_TEST(untied.flops_per_token(2048) == untied.flops_per_token_without_tied_output(2048));
  BOOST_TEST(untied.flops_per_token(2048) == m.flops_per_token(2048));
}

BOOST_AUTO_TEST_CASE(init_is_a_pure_function_of_seed_name_index) {
  auto d = make_device("cpu", 2);
  Transformer m(small_args(), *d);
  m.init_weights(5);
  Parameter* p = m.find("layers.1.feed_forward.w2.weight");
  std::vector<float> part(10);
  init_range(*p, 5, 100, 10, part.data());  // a shard's range
  for (int i = 0; i < 10; ++i) BOOST_TEST(part[i] == p->value.f32()[100 + i]);
  Transformer m2(small_args(), *d);
  m2.init_weights(6);
  BOOST_TEST(m2.find("layers.1.feed_forward.w2.weight")->value.f32()[0] != p->value.f32()[0]);
  BOOST_TEST(m.find("norm.weight")->value.f32()[3] == 1.0f);
}

BOOST_AUTO_TEST_CASE(activation_checkpointing_reproduces_gradients_exactly) {
  auto d = make_device("cpu", 2);
  Transformer m(small_args(), *d);
  m.init_weights(11);
  auto none = run(m, *d, CheckpointPolicy::from_deck("none", "1"));
  auto full = run(m, *d, CheckpointPolicy::from_deck("full", "1"));
  auto sel = run(m, *d, CheckpointPolicy::from_deck("selective", "2"));
  BOOST_TEST(none.first == full.first);
  BOOST_TEST(none.second == full.second);  // recomputation is bitwise identical
  BOOST_TEST(none.second == sel.second);
  BOOST_CHECK_THROW(CheckpointPolicy::from_deck("selective", "0"), std::invalid_argument);
  BOOST_CHECK_THROW(CheckpointPolicy::from_deck("selective", "-1"), std::invalid_argument);
  BOOST_TEST((CheckpointPolicy::from_deck("selective", "op").mode == CheckpointPolicy::Mode::kOp));
}

// Per-operator selective checkpointing (selective_ac_option = "op") replays each block's forward
// with the kept operators' outputs: losses and gradients bitwise those without checkpointing, for
// a dense Llama, Qwen3's q/k norm and a MoE model (router, grouped experts, shared experts,
// balance and z-losses).
BOOST_AUTO_TEST_CASE(per_op_checkpointing_reproduces_gradients_exactly) {
  auto d = make_device("cpu", 2);
  const CheckpointPolicy op = CheckpointPolicy::from_deck("selective", "op");
  std::vector<ModelArgs> models(3, small_args());
  models[1].qk_norm = true;
  ModelArgs& moe = models[2];
  moe.num_experts = 4;
  moe.top_k = 2;
  moe.moe_inter_dim = 24;
  moe.n_dense_layers = 1;
  moe.num_shared_experts = 1;
  moe.aux_loss_coeff = 0.01;
  moe.z_loss_coeff = 0.001;
  for (const ModelArgs& a : models) {
    Transformer m(a, *d);
    m.init_weights(11);
    auto none = run(m, *d, CheckpointPolicy::from_deck("none", "1"));
    auto per_op = run(m, *d, op);
    BOOST_TEST(none.first == per_op.first);
    BOOST_TEST(none.second == per_op.second);
  }
}

// The keep rule: attention and collectives always, matmuls 1, 3, 5, … of the forward; a replay
// hands back the recorded outputs (copies where the forward writes them later) and runs the rest.
BOOST_AUTO_TEST_CASE(per_op_stash_keeps_every_second_matmul) {
  auto d = make_device("cpu", 1);
  int runs = 0;
  const auto value = [&](float v) {
    ++runs;
    Tensor t = d->empty({2}, DType::kF32, MemCategory::kActivations);
    d->fill(t, v);
    return t;
  };
  SavedTensors s;
  s.set_mode(SavedTensors::Mode::kOpRecord);
  std::vector<Tensor> first;
  for (int i = 0; i < 4; ++i) first.push_back(s.op(SacOp::kMatmul, *d, [&] { return value(float(i)); }, true));
  first.push_back(s.op(SacOp::kAttention, *d, [&] { return value(9.0f); }, false));
  s.push(first[0]);
  BOOST_TEST(s.empty());               // the first pass drops pushes
  BOOST_TEST(s.stashed() == 3u);       // matmuls 1 and 3, the attention
  BOOST_TEST(s.stashed_bytes() == 3 * 2 * 4);
  d->fill(first[0], -1.0f);            // written in place after the op: the stash holds a copy
  s.set_mode(SavedTensors::Mode::kOpReplay);
  runs = 0;
  std::vector<Tensor> again;
  for (int i = 0; i < 4; ++i) again.push_back(s.op(SacOp::kMatmul, *d, [&] { return value(float(i)); }, true));
  again.push_back(s.op(SacOp::kAttention, *d, [&] { return value(9.0f); }, false));
  BOOST_TEST(runs == 2);               // only matmuls 2 and 4 run again
  BOOST_TEST(again[0].f32()[0] == 0.0f);
  BOOST_TEST(again[4].raw() == first[4].raw());  // not written later: kept without a copy
  BOOST_TEST(s.stashed() == 0u);
  BOOST_CHECK_THROW(s.op(SacOp::kCollective, *d, [&] { return value(1.0f); }, false), std::logic_error);
}

BOOST_AUTO_TEST_CASE(rope_scaling_follows_llama31) {
  ModelArgs a = small_args();
  a.head_dim = 128;
  a.rope_theta = 500000;
  auto plain = rope_frequencies(a);
  a.use_rope_scaling = true;
  auto scaled = rope_frequencies(a);
  BOOST_TEST(scaled[0] == plain[0]);                 // high frequency kept
  BOOST_TEST(std::fabs(scaled[63] - plain[63] / 8) < 1e-15);  // low frequency divided by the factor
}
