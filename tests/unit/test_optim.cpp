#define BOOST_TEST_MODULE optim
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <memory>

#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "tiny_model.hpp"

using namespace meshtrain;

BOOST_AUTO_TEST_CASE(warmup_stable_decay_schedule) {
  LrSchedulerSection s;
  s.warmup_steps = 4;
  s.decay_ratio = 0.5;
  s.decay_type = "linear";
  s.min_lr_factor = 0.1;
  LrSchedule lr(s, 1.0, 20);  // warmup 4, stable 6, decay 10
  BOOST_TEST(lr.lr(1) == 1.0 / 5);
  BOOST_TEST(lr.lr(4) == 4.0 / 5);
  BOOST_TEST(lr.lr(5) == 1.0);
  BOOST_TEST(lr.lr(11) == 1.0);  // first decay step: progress 0
  BOOST_TEST(std::fabs(lr.lr(20) - (0.1 + 0.9 * 0.1)) < 1e-12);
  s.decay_type = "cosine";
  LrSchedule c(s, 1.0, 20);
  BOOST_TEST(std::fabs(c.lr(16) - (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)))) < 1e-12);
  s.decay_type = "sqrt";
  LrSchedule q(s, 1.0, 20);
  BOOST_TEST(std::fabs(q.lr(15) - (0.1 + 0.9 * (1 - std::sqrt(0.4)))) < 1e-12);
  s.decay_ratio.reset();  // decay over everything after warmup
  LrSchedule all(s, 2.0, 20);
  BOOST_TEST(all.decay_steps() == 16);
}

BOOST_AUTO_TEST_CASE(adamw_matches_closed_form_and_skips_decay_on_norms) {
  auto dev = make_device("cpu", 1);
  const ModelArgs a = testing::tiny_model_args(16, 1, 2, 2, 10);
  Transformer m(a, *dev);
  m.init_weights(1);
  dev->fill(m.flat_grads(), 0.5f);
  OptimizerSection cfg;
  cfg.lr = 0.1;
  cfg.weight_decay = 0.2;
  Parameter* w = m.find("layers.0.attention.wq.weight");
  Parameter* n = m.find("norm.weight");
  const float w0 = w->value.f32()[0], n0 = n->value.f32()[0];
  const auto shards = replicated_shards(m);
  AdamW opt(shards, *dev, cfg);
  opt.step(0.1f, 1.0f);
  // t = 1: m̂ = g, v̂ = g², update = lr·g/(|g| + eps) = lr·sign(g).
  const double upd = 0.1 * 0.5 / (0.5 + 1e-8);
  BOOST_TEST(std::fabs(w->value.f32()[0] - (w0 * (1 - 0.1 * 0.2) - upd)) < 1e-6);
  BOOST_TEST(std::fabs(n->value.f32()[0] - (n0 - upd)) < 1e-6);  // no weight decay on norms
}

BOOST_AUTO_TEST_CASE(clip_coefficient_scales_to_max_norm) {
  auto dev = make_device("cpu", 1);
  const ModelArgs a = testing::tiny_model_args(16, 1, 2, 2, 10);
  Transformer m(a, *dev);
  dev->fill(m.flat_grads(), 0.0f);
  for (Parameter* p : m.parameters()) dev->fill(p->grad, 1.0f);
  const auto shards = replicated_shards(m);
  const double norm = std::sqrt(local_sum_squares(*dev, shards));
  BOOST_TEST(std::fabs(norm - std::sqrt(double(a.num_params()))) < 1e-6);
  const double c = clip_coefficient(norm, 1.0);
  BOOST_TEST(std::fabs(c * norm - 1.0) < 1e-6);
  BOOST_TEST(clip_coefficient(0.5, 1.0) == 1.0);   // below max_norm: untouched
  BOOST_TEST(clip_coefficient(1e9, 0.0) == 1.0);   // max_norm 0: clipping off
  BOOST_TEST(clip_coefficient(1e9, -1.0) == 1.0);
}

namespace {
/// A tiny model with weights from `seed`, every gradient element set from a fixed pattern.
struct Stepped {
  std::unique_ptr<Device> dev = make_device("cpu", 1);
  ModelArgs args = testing::tiny_model_args(16, 1, 2, 2, 10);
  Transformer model;
  std::vector<LocalShard> shards;
  explicit Stepped(DType compute = DType::kF32) : model(args, *dev, {}, {}, compute) {
    model.init_weights(3);
    int64_t k = 0;
    for (Parameter* p : model.parameters())
      for (int64_t i = 0; i < p->grad.numel(); ++i, ++k) p->grad.f32()[i] = 0.37f * std::sin(0.7f * float(k)) + 0.01f;
    shards = replicated_shards(model);
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(adamw_grad_scale_equals_scaling_the_gradients_first) {
  // The clip coefficient applied as AdamW reads each gradient gives the bits of the old path
  // (every gradient scaled in place, then the step), over three steps, and leaves the
  // gradients as they were.
  Stepped fused, scaled;
  OptimizerSection cfg;
  cfg.lr = 0.01;
  cfg.weight_decay = 0.1;
  AdamW a(fused.shards, *fused.dev, cfg), b(scaled.shards, *scaled.dev, cfg);
  const float s = 0.3719f;
  const Tensor& gb = scaled.model.flat_grads();
  const std::vector<float> g0(gb.f32(), gb.f32() + gb.numel());
  for (int step = 0; step < 3; ++step) {
    a.step(0.01f, s);
    std::copy(g0.begin(), g0.end(), gb.f32());  // the old path: scale in place, then step
    for (const LocalShard& ls : scaled.shards) scaled.dev->scale(ls.grad, s);
    b.step(0.01f, 1.0f);
  }
  const Tensor& pa = fused.model.flat_params();
  const Tensor& pb = scaled.model.flat_params();
  BOOST_REQUIRE_EQUAL(pa.numel(), pb.numel());
  BOOST_TEST(std::equal(pa.f32(), pa.f32() + pa.numel(), pb.f32()));
  BOOST_TEST(std::equal(a.exp_avg().f32(), a.exp_avg().f32() + a.exp_avg().numel(), b.exp_avg().f32()));
  BOOST_TEST(std::equal(a.exp_avg_sq().f32(), a.exp_avg_sq().f32() + a.exp_avg_sq().numel(), b.exp_avg_sq().f32()));
  const Tensor& ga = fused.model.flat_grads();
  BOOST_TEST(std::equal(ga.f32(), ga.f32() + ga.numel(), g0.begin()));  // not written
}

BOOST_AUTO_TEST_CASE(adamw_writes_the_bf16_compute_copies_it_is_given) {
  // Mixed precision with replicated parameters: the step writes each copy as cast() would
  // (rounded to nearest even), so the model need not recast before the next forward.
  Stepped m(DType::kBF16);
  OptimizerSection cfg;
  cfg.lr = 0.01;
  AdamW opt(m.shards, *m.dev, cfg);
  std::vector<Tensor> copies;
  for (size_t i = 0; i < m.shards.size(); ++i)
    copies.push_back(i % 3 == 1 ? Tensor() : m.model.held_compute_copy(*m.shards[i].param));  // some left out
  BOOST_TEST(opt.write_compute_copies(copies));
  opt.step(0.01f, 0.5f);
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const Tensor& v = m.shards[i].value;
    Tensor want = m.dev->empty({v.numel()}, DType::kBF16, MemCategory::kTemporaries);
    m.dev->cast(want, v);
    const Tensor have = m.model.held_compute_copy(*m.shards[i].param);
    BOOST_REQUIRE(have.defined());
    const bool equal = std::equal(have.bf16(), have.bf16() + v.numel(), want.bf16());
    BOOST_TEST(equal == (i % 3 != 1), "shard " << i << " (" << m.shards[i].param->name << ")");
  }
  // A float32 model holds no copies; a copy of the wrong size or dtype is refused.
  Stepped f;
  BOOST_TEST(!f.model.held_compute_copy(*f.shards[0].param).defined());
  std::vector<Tensor> bad(m.shards.size());
  bad[0] = m.dev->empty({m.shards[0].value.numel() + 1}, DType::kBF16, MemCategory::kTemporaries);
  BOOST_CHECK_THROW(opt.write_compute_copies(bad), std::invalid_argument);
  bad[0] = m.dev->empty({m.shards[0].value.numel()}, DType::kF32, MemCategory::kTemporaries);
  BOOST_CHECK_THROW(opt.write_compute_copies(bad), std::invalid_argument);
  BOOST_CHECK_THROW(opt.write_compute_copies({}), std::invalid_argument);
}
