#define BOOST_TEST_MODULE weight_grad_queue
// Split backward (zero-bubble pipeline schedules): layers compute input gradients only and
// record their weight-gradient terms in a WeightGradQueue; running it must give exactly the
// gradients of the fused backward.
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "model/transformer.hpp"
#include "model/weight_grad_queue.hpp"
#include "tiny_model.hpp"
#include "util/rng.hpp"

using namespace meshtrain;

namespace {

// The Llama flavor (separate output projection) and the Qwen3 one (q/k norms, tied embeddings).
ModelArgs flavor(bool qwen3) {
  ModelArgs a = testing::tiny_model_args();
  a.qk_norm = qwen3;
  a.tie_word_embeddings = qwen3;
  return a;
}

std::vector<float> host_copy(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Backward {
  std::vector<float> grads;               // the flat gradient buffer after the (deferred) weight gradients
  std::vector<std::vector<float>> dxs;    // each unit's returned input gradient, last unit first
};

// Forward through m.units() (one SavedTensors per unit), then backward in reverse order. With
// `queue`, checks that the backward left every gradient at zero and recorded `expect_terms`
// terms, then runs the queue.
Backward forward_backward(Transformer& m, WeightGradQueue* queue, size_t expect_terms) {
  const int64_t b = 2, t = 8;
  std::vector<int32_t> samples(size_t(b * (t + 1)));
  for (size_t i = 0; i < samples.size(); ++i)
    samples[i] = int32_t(counter_u64(7, 1, i) % uint64_t(m.args().vocab_size));
  StepContext ctx = m.make_context(samples.data(), b, t, 1.0f / float(b * t), true);
  ctx.defer_weight_grads = queue;
  m.zero_grad();
  const std::vector<Layer*>& units = m.units();
  std::vector<SavedTensors> saved(units.size());
  Tensor h;
  for (size_t u = 0; u < units.size(); ++u) h = units[u]->forward(ctx, saved[u], h);
  Backward out;
  Tensor d;
  for (size_t u = units.size(); u-- > 0;) {
    d = units[u]->backward(ctx, saved[u], d);
    if (d.defined()) out.dxs.push_back(host_copy(d));
  }
  if (queue) {
    const std::vector<float> zeros(size_t(m.flat_grads().numel()), 0.0f);
    BOOST_TEST(same_bits(host_copy(m.flat_grads()), zeros), "a deferred backward accumulated a weight gradient");
    BOOST_TEST(queue->size() == expect_terms);
    BOOST_TEST(queue->bytes_held() > 0);
    queue->run(*ctx.dev);
    BOOST_TEST(queue->empty());
    BOOST_TEST(queue->bytes_held() == 0);
  }
  out.grads = host_copy(m.flat_grads());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(split_backward_matches_fused_bitwise) {
  for (bool qwen3 : {false, true}) {
    BOOST_TEST_CONTEXT((qwen3 ? "qwen3 (q/k norms, tied embeddings)" : "llama")) {
      const ModelArgs a = flavor(qwen3);
      auto dev = make_device("cpu", 2);
      Transformer m(a, *dev);
      m.init_weights(3);
      // Terms: per block 7 linears and 2 norms (+ q_norm, k_norm), the head's norm and
      // projection (the embedding's weight when tied), the embedding's scatter-add.
      const size_t terms = size_t(a.n_layers) * (9 + (qwen3 ? 2 : 0)) + 2 + 1;
      const Backward fused = forward_backward(m, nullptr, 0);
      WeightGradQueue queue;
      const Backward split = forward_backward(m, &queue, terms);
      BOOST_TEST(same_bits(fused.grads, split.grads), "parameter gradients differ");
      BOOST_TEST_REQUIRE(fused.dxs.size() == split.dxs.size());
      for (size_t i = 0; i < fused.dxs.size(); ++i)
        BOOST_TEST(same_bits(fused.dxs[i], split.dxs[i]), "input gradient " << i << " (from the last unit) differs");
      // Every parameter got a gradient (the comparison above is not between zeros).
      for (Parameter* p : m.parameters()) {
        const std::vector<float> g = host_copy(p->grad);
        bool nonzero = false;
        for (float v : g) nonzero |= v != 0.0f;
        BOOST_TEST(nonzero, p->name << " has an all-zero gradient");
      }
    }
  }
}

// The gradient a term accumulates into is the parameter's binding when run() executes (FSDP
// binds grads only while a unit is gathered); an unbound one throws and leaves the queue whole.
BOOST_AUTO_TEST_CASE(run_resolves_the_grad_binding_at_run_time) {
  auto dev = make_device("cpu", 1);
  Device& d = *dev;
  Parameter w = make_parameter("layers.0.feed_forward.w1.weight", {3, 2}, InitSpec{});
  Tensor dy = d.empty({4, 3}, DType::kF32, MemCategory::kActivations);
  Tensor x = d.empty({4, 2}, DType::kF32, MemCategory::kActivations);
  for (int64_t i = 0; i < 12; ++i) dy.f32()[i] = float(i % 5) - 2.0f;
  for (int64_t i = 0; i < 8; ++i) x.f32()[i] = 0.5f * float(i) - 1.0f;
  Tensor gathered = d.zeros({3, 2}, DType::kF32, MemCategory::kGradients);
  w.grad = gathered;  // bound while the backward records (the unit is gathered)
  WeightGradQueue queue;
  queue.linear(dy, x, w);
  w.grad = Tensor();  // resharded: unbound
  BOOST_CHECK_EXCEPTION(queue.run(d), std::logic_error, [](const std::logic_error& e) {
    return std::string(e.what()).find("layers.0.feed_forward.w1.weight") != std::string::npos;
  });
  BOOST_TEST(queue.size() == 1u);  // nothing ran, nothing was dropped

  Tensor regathered = d.zeros({3, 2}, DType::kF32, MemCategory::kGradients);
  w.grad = regathered;  // gathered again for W: this binding receives the term
  queue.run(d);
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t i = 0; i < 2; ++i) {
      float expect = 0;  // small multiples of 1/4: exact in any summation order
      for (int64_t n = 0; n < 4; ++n) expect += dy.f32()[n * 3 + o] * x.f32()[n * 2 + i];
      BOOST_TEST(regathered.f32()[o * 2 + i] == expect, "dW[" << o << ", " << i << "]");
      BOOST_TEST(gathered.f32()[o * 2 + i] == 0.0f);
    }
  BOOST_TEST(queue.empty());

  w.grad = d.zeros({2, 3}, DType::kF32, MemCategory::kGradients);  // wrong shape at run time
  queue.linear(dy, x, w);
  BOOST_CHECK_THROW(queue.run(d), std::logic_error);
  queue.clear();
  BOOST_TEST(queue.empty());
}

BOOST_AUTO_TEST_CASE(recording_checks_shapes_and_counts_shared_buffers_once) {
  auto dev = make_device("cpu", 1);
  Device& d = *dev;
  Parameter wq = make_parameter("attention.wq.weight", {6, 4}, InitSpec{});
  Parameter wk = make_parameter("attention.wk.weight", {2, 4}, InitSpec{});
  Parameter norm = make_parameter("norm.weight", {4}, InitSpec{});
  Parameter emb = make_parameter("tok_embeddings.weight", {10, 4}, InitSpec{});
  Tensor x = d.empty({5, 4}, DType::kF32, MemCategory::kActivations);
  Tensor dq = d.empty({5, 6}, DType::kF32, MemCategory::kActivations);
  Tensor dk = d.empty({5, 2}, DType::kF32, MemCategory::kActivations);
  Tensor rstd = d.empty({5}, DType::kF32, MemCategory::kActivations);
  Tensor tokens = d.empty({5}, DType::kI32, MemCategory::kActivations);
  WeightGradQueue q;
  q.linear(dq, x, wq);
  q.linear(dk, x, wk);  // the same x: held once
  q.rmsnorm(x, x, rstd, norm);
  BOOST_TEST(q.bytes_held() == int64_t(x.nbytes() + dq.nbytes() + dk.nbytes() + rstd.nbytes()));
  q.embedding(x, tokens, emb, 0);
  BOOST_TEST(q.bytes_held() == int64_t(x.nbytes() + dq.nbytes() + dk.nbytes() + rstd.nbytes() + tokens.nbytes()));
  BOOST_TEST(q.size() == 4u);

  auto names = [](const char* param) {
    return [param](const std::invalid_argument& e) { return std::string(e.what()).find(param) != std::string::npos; };
  };
  BOOST_CHECK_EXCEPTION(q.linear(dk, x, wq), std::invalid_argument, names("attention.wq.weight"));  // out 2 vs 6
  BOOST_CHECK_EXCEPTION(q.linear(dq, dq, wq), std::invalid_argument, names("attention.wq.weight"));  // in 6 vs 4
  BOOST_CHECK_EXCEPTION(q.rmsnorm(x, x, tokens.view({4}), norm), std::invalid_argument, names("norm.weight"));
  BOOST_CHECK_EXCEPTION(q.embedding(dq, tokens, emb, 0), std::invalid_argument, names("tok_embeddings.weight"));
  BOOST_CHECK_EXCEPTION(q.embedding(x, rstd, emb, 0), std::invalid_argument, names("tok_embeddings.weight"));
  BOOST_TEST(q.size() == 4u);  // rejected terms are not recorded
}
