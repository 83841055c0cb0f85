#define BOOST_TEST_MODULE optim
#include <boost/test/unit_test.hpp>
#include <cmath>

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
  opt.step(0.1f);
  // t = 1: m̂ = g, v̂ = g², update = lr·g/(|g| + eps) = lr·sign(g).
  const double upd = 0.1 * 0.5 / (0.5 + 1e-8);
  BOOST_TEST(std::fabs(w->value.f32()[0] - (w0 * (1 - 0.1 * 0.2) - upd)) < 1e-6);
  BOOST_TEST(std::fabs(n->value.f32()[0] - (n0 - upd)) < 1e-6);  // no weight decay on norms
}

BOOST_AUTO_TEST_CASE(clipping_scales_to_max_norm) {
  auto dev = make_device("cpu", 1);
  const ModelArgs a = testing::tiny_model_args(16, 1, 2, 2, 10);
  Transformer m(a, *dev);
  dev->fill(m.flat_grads(), 0.0f);
  for (Parameter* p : m.parameters()) dev->fill(p->grad, 1.0f);
  const auto shards = replicated_shards(m);
  const double norm = std::sqrt(local_sum_squares(*dev, shards));
  BOOST_TEST(std::fabs(norm - std::sqrt(double(a.num_params()))) < 1e-6);
  clip_grad_norm(*dev, shards, norm, 1.0);
  BOOST_TEST(std::fabs(std::sqrt(local_sum_squares(*dev, shards)) - 1.0) < 1e-5);
}
