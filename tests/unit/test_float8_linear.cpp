// Float8 linear layers (model/layers/primitives.hpp with Parameter::float8): a non-finite value
// in a GEMM operand makes its scaling group's amax non-finite, and every value of that group
// comes out NaN — never a silently saturated finite number — so the loss and the gradient norm
// turn non-finite and the trainer's non-finite guard (train/nonfinite_guard.hpp) stops or skips
// the step. Also: which linears convert_float8_linears marks.
#define BOOST_TEST_MODULE test_float8_linear
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <memory>

#include "device/cpu/cpu_device.hpp"
#include "model/float8_linears.hpp"
#include "model/layers/primitives.hpp"
#include "tensor/float8.hpp"

using namespace meshtrain;

namespace {

constexpr int64_t kM = 4, kK = 16, kN = 16;

Tensor filled(Device& d, const Shape& s, float base) {
  Tensor t = d.empty(s, DType::kF32, MemCategory::kTemporaries);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = base * float((i * 7) % 11 - 5);
  return t;
}

struct Linear {
  CpuDevice dev{1};
  Parameter w = make_parameter("layers.0.feed_forward.w1.weight", {kN, kK}, InitSpec{});
  explicit Linear(const std::string& recipe) {
    w.value = filled(dev, {kN, kK}, 0.01f);
    w.grad = dev.empty({kN, kK}, DType::kF32, MemCategory::kTemporaries);
    dev.fill(w.grad, 0.0f);
    w.float8 = std::make_shared<const Float8LinearRecipe>(float8_linear_recipe(recipe));
  }
};

int64_t nan_count(const Tensor& t, int64_t row = -1) {
  int64_t n = 0;
  const int64_t cols = t.dim(1);
  for (int64_t i = 0; i < t.numel(); ++i)
    if ((row < 0 || i / cols == row) && std::isnan(t.f32()[i])) ++n;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(non_finite_amax_poisons_its_group) {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    // rowwise: x's row 1 holds the bad value; y's row 1 is NaN, the other rows finite. dW reads x
    // scaled per column: column 3's group is poisoned, so dW's column 3 is NaN.
    Linear rw("rowwise");
    Tensor x = filled(rw.dev, {kM, kK}, 0.5f);
    x.f32()[1 * kK + 3] = bad;
    const Tensor y = linear_forward(rw.dev, x, rw.w);
    BOOST_TEST(nan_count(y, 1) == kN);
    BOOST_TEST(nan_count(y) == kN);
    StepContext ctx;
    ctx.dev = &rw.dev;
    linear_backward(ctx, filled(rw.dev, {kM, kN}, 0.25f), x, rw.w);
    for (int64_t r = 0; r < kN; ++r) BOOST_TEST(std::isnan(rw.w.grad.f32()[r * kK + 3]));
    BOOST_TEST(nan_count(rw.w.grad) == kN);
    // tensorwise: one scale for the whole tensor, so all of y is NaN, and all of dW.
    Linear tw("tensorwise");
    ctx.dev = &tw.dev;
    const Tensor y2 = linear_forward(tw.dev, x, tw.w);
    BOOST_TEST(nan_count(y2) == kM * kN);
    linear_backward(ctx, filled(tw.dev, {kM, kN}, 0.25f), x, tw.w);
    BOOST_TEST(nan_count(tw.w.grad) == kN * kK);
    // A non-finite gradient reaching the backward GEMMs does the same to dx.
    Tensor dy = filled(tw.dev, {kM, kN}, 0.25f);
    dy.f32()[5] = bad;
    BOOST_TEST(nan_count(linear_backward(ctx, dy, filled(tw.dev, {kM, kK}, 0.5f), tw.w)) == kM * kK);
  }
}

BOOST_AUTO_TEST_CASE(finite_inputs_stay_finite_and_are_quantized) {
  Linear rw("rowwise");
  const Tensor x = filled(rw.dev, {kM, kK}, 0.37f);
  const Tensor y = linear_forward(rw.dev, x, rw.w);
  BOOST_TEST(nan_count(y) == 0);
  rw.w.float8.reset();  // the same layer in float32
  const Tensor y32 = linear_forward(rw.dev, x, rw.w);
  bool differs = false;
  for (int64_t i = 0; i < y.numel(); ++i) differs = differs || y.f32()[i] != y32.f32()[i];
  BOOST_TEST(differs);
}

// TorchTitan's converter: the blocks' linears (and the router gate) with both dims multiples of
// 16, not the output head, embedding or experts; filter_fqns by substring.
BOOST_AUTO_TEST_CASE(convert_marks_the_block_linears) {
  ModelArgs a;
  a.dim = 64;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.vocab_size = 256;
  a.ffn_hidden_dim = 128;
  CpuDevice dev(1);
  Transformer model(a, dev);
  Float8Config f8;
  f8.enabled = true;
  f8.filter_fqns = {"output", "layers.1.attention"};
  const std::vector<std::string> got = convert_float8_linears(model, f8);
  const std::vector<std::string> want = {"layers.0.attention.wq", "layers.0.attention.wk", "layers.0.attention.wv",
                                         "layers.0.attention.wo", "layers.0.feed_forward.w1",
                                         "layers.0.feed_forward.w2", "layers.0.feed_forward.w3",
                                         "layers.1.feed_forward.w1", "layers.1.feed_forward.w2",
                                         "layers.1.feed_forward.w3"};
  BOOST_TEST(got == want, boost::test_tools::per_element());
  BOOST_TEST(model.find("output.weight")->float8 == nullptr);
  BOOST_TEST(model.find("tok_embeddings.weight")->float8 == nullptr);
  BOOST_TEST(model.find("layers.0.attention.wq.weight")->float8->name == "tensorwise");
}
