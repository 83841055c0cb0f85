#define BOOST_TEST_MODULE chunked_loss
// Chunked cross-entropy ([model] loss_chunk_tokens) and PaLM's z-loss on the output logits
// ([model] output_z_loss_coeff), on 2 ranks (fp32, CPU):
// - one forward + backward of a whole model with the head chunked (256, 512, 768, 1024 tokens of
//   a 1280-token micro-batch: 768 and 512 do not divide it) gives a loss, a z-loss and every
//   parameter gradient bitwise equal to the unchunked head, with the z-loss off and on, with tied
//   embeddings, under tensor parallelism 2 (vocab-parallel loss, and the gathered-logits loss;
//   sequence parallelism on and off), and with the backward split into input and weight halves
//   (zero-bubble schedules); a forward without backward (validation) gives the same loss;
// - the z-loss leaves the cross-entropy alone, changes the gradients, and its sum is ζ·Σ lse².
// The z-loss's value and gradient against an independent float64 formula: validation/check_z_loss.py.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <memory>

#include "graph/executor.hpp"
#include "model/layers/embedding.hpp"
#include "model/transformer.hpp"
#include "mpi/mpi_fixture.hpp"
#include "tiny_model.hpp"
#include "mpi/tp_setup.hpp"

using namespace meshtrain;

namespace {

constexpr int64_t kBatch = 2, kSeq = 640;  // 1280 tokens: five blocks of the CPU head's 256 rows

// What one forward (+ backward) of the fixed micro-batch leaves behind.
struct Result {
  double loss = 0, z_loss = 0;
  std::vector<std::vector<float>> grads;  // every parameter's gradient, in parameter order
};

enum class Backward { kNone, kFused, kSplit };

// The tiny model, its vocabulary 301 split 151 + 150 over tp 2.
ModelArgs args(bool tied) {
  ModelArgs a = testing::tiny_model_args(32, 2, 4, 2, 301);
  a.tie_word_embeddings = tied;
  return a;
}

Result run(ModelArgs a, Device& dev, const TensorParallel& tp, int64_t chunk, double zeta, Backward mode) {
  a.loss_chunk_tokens = chunk;
  a.output_z_loss_coeff = zeta;
  Transformer m(a, dev, ModelStorage{}, tp);
  m.init_weights(11);
  std::vector<int32_t> s(size_t(kBatch * (kSeq + 1)));
  for (size_t i = 0; i < s.size(); ++i) s[i] = int32_t((i * 2654435761u >> 7) % uint64_t(a.vocab_size));
  Executor exec(m.units(), m.block_index(), CheckpointPolicy{});
  StepContext ctx = m.make_context(s.data(), kBatch, kSeq, 1.0f / float(kBatch * kSeq), mode != Backward::kNone);
  if (mode == Backward::kFused) {
    exec.forward_backward(ctx);
  } else if (mode == Backward::kSplit) {
    exec.forward(0, ctx, Tensor());  // the split backward: input gradients first, weight terms later
    exec.backward_input(0, ctx, Tensor());
    exec.backward_weight(0);
  } else {
    exec.forward_only(ctx);
  }
  Result r;
  r.loss = ctx.loss_sum;
  r.z_loss = dynamic_cast<OutputHead&>(*m.units().back()).z_loss_sum();
  if (mode != Backward::kNone)
    for (Parameter* p : m.parameters()) {
      r.grads.emplace_back(size_t(p->grad.numel()));
      std::memcpy(r.grads.back().data(), p->grad.raw(), r.grads.back().size() * sizeof(float));
    }
  return r;
}

void check_equal(const Result& got, const Result& want, const std::string& what) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_TEST(got.loss == want.loss);
    BOOST_TEST(got.z_loss == want.z_loss);
    BOOST_TEST_REQUIRE(got.grads.size() == want.grads.size());
    for (size_t i = 0; i < got.grads.size(); ++i)
      BOOST_TEST(std::memcmp(got.grads[i].data(), want.grads[i].data(), got.grads[i].size() * sizeof(float)) == 0,
                 "gradient " << i << " differs");
  }
}

}  // namespace

using testing::MpiFixture;
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

BOOST_AUTO_TEST_CASE(chunked_head_is_bitwise_the_unchunked_head) {
  auto dev = make_device("cpu", 1);
  for (bool tied : {false, true})
    for (double zeta : {0.0, 1e-2}) {
      const Result want = run(args(tied), *dev, {}, 0, zeta, Backward::kFused);
      for (int64_t chunk : {256, 512, 768, 1024}) {
        if (tied && chunk != 768) continue;
        check_equal(run(args(tied), *dev, {}, chunk, zeta, Backward::kFused), want,
                    "chunk " + std::to_string(chunk) + ", z-loss " + std::to_string(zeta) + (tied ? ", tied" : ""));
      }
      // Validation's forward: the same loss and z-loss, nothing saved.
      const Result fwd = run(args(tied), *dev, {}, 512, zeta, Backward::kNone);
      BOOST_TEST(fwd.loss == want.loss);
      BOOST_TEST(fwd.z_loss == want.z_loss);
    }
}

BOOST_AUTO_TEST_CASE(z_loss_enters_the_gradient_not_the_loss) {
  auto dev = make_device("cpu", 1);
  const Result off = run(args(false), *dev, {}, 0, 0.0, Backward::kFused);
  const Result on = run(args(false), *dev, {}, 512, 0.5, Backward::kFused);
  BOOST_TEST(on.loss == off.loss);
  BOOST_TEST(off.z_loss == 0.0);
  BOOST_TEST(on.z_loss > 0.0);
  // Every parameter feeds the logits, so every gradient moves with the z-loss.
  for (size_t i = 0; i < on.grads.size(); ++i)
    BOOST_TEST(std::memcmp(on.grads[i].data(), off.grads[i].data(), on.grads[i].size() * sizeof(float)) != 0,
               "gradient " << i << " ignores the z-loss");
}

BOOST_AUTO_TEST_CASE(split_backward_matches_the_fused_backward) {
  auto dev = make_device("cpu", 1);
  const Result want = run(args(false), *dev, {}, 0, 1e-2, Backward::kFused);
  check_equal(run(args(false), *dev, {}, 0, 1e-2, Backward::kSplit), want, "unchunked, split backward");
  check_equal(run(args(false), *dev, {}, 768, 1e-2, Backward::kSplit), want, "chunk 768, split backward");
}

BOOST_AUTO_TEST_CASE(chunked_head_under_tensor_parallelism) {
  for (bool sp : {true, false})
    for (bool lp : {true, false}) {
      const testing::TpSetup setup(2, sp, lp);
      for (bool tied : {false, true}) {
        const Result want = run(args(tied), *setup.dev, setup.tp, 0, 1e-2, Backward::kFused);
        check_equal(run(args(tied), *setup.dev, setup.tp, 768, 1e-2, Backward::kFused), want,
                    std::string("tp 2, chunk 768") + (sp ? ", sequence parallel" : "") +
                        (lp ? ", loss parallel" : ", gathered logits") + (tied ? ", tied" : ""));
      }
    }
}
