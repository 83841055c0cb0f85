#define BOOST_TEST_MODULE muon
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <vector>

#include "optim/muon.hpp"
#include "optim/muon_plan.hpp"
#include "optim/newton_schulz.hpp"
#include "tiny_model.hpp"

using namespace meshtrain;

namespace {

/// The scalar quintic applied `steps` times: what Newton–Schulz does to each singular value.
double quintic(double s, int steps) {
  const NewtonSchulzCoefficients c;
  for (int i = 0; i < steps; ++i) s = c.a * s + c.b * s * s * s + c.c * s * s * s * s * s;
  return s;
}

/// G = P·diag(σ) embedded in [m, n] (P a permutation with signs): its SVD is known exactly, so
/// the orthogonalization must equal P·diag(quintic(σ/‖σ‖)).
void check_known_svd(int64_t m, int64_t n, int steps) {
  auto dev = make_device("cpu", 1);
  const int64_t k = std::min(m, n);
  std::vector<double> sigma;
  for (int64_t i = 0; i < k; ++i) sigma.push_back(0.3 + 0.7 * double(i) / double(k));
  double norm = 0;
  for (double s : sigma) norm += s * s;
  norm = std::sqrt(norm);
  Tensor g = dev->zeros({m, n}, DType::kF32, MemCategory::kTemporaries);
  auto at = [&](int64_t i) { return ((i * 2) % m) * n + (i * 5 + 1) % n; };  // distinct rows, columns (coprime strides)
  for (int64_t i = 0; i < k; ++i) g.f32()[at(i)] = float((i % 2 ? -1 : 1) * sigma[size_t(i)]);
  newton_schulz_orthogonalize(*dev, g, steps);
  double err = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double want = (i % 2 ? -1 : 1) * quintic(sigma[size_t(i)] / (norm + 1e-7), steps);
    err = std::max(err, std::fabs(g.f32()[at(i)] - want));
    g.f32()[at(i)] = 0;
  }
  for (int64_t i = 0; i < m * n; ++i) err = std::max(err, double(std::fabs(g.f32()[i])));
  BOOST_TEST_INFO("[" << m << ", " << n << "] " << steps << " steps");
  BOOST_TEST(err < 2e-5);
}

}  // namespace

BOOST_AUTO_TEST_CASE(newton_schulz_maps_each_singular_value_by_the_quintic) {
  check_known_svd(7, 11, 5);  // wide
  check_known_svd(13, 6, 5);  // tall: iterates on the transpose
  check_known_svd(9, 9, 4);   // even number of steps ends in place
  // Five steps push every singular value from 0.3/‖σ‖ upwards into Muon's band, about [0.7, 1.2].
  for (double s = 0.05; s <= 1.0; s += 0.05) BOOST_TEST((quintic(s, 5) > 0.6 && quintic(s, 5) < 1.25));
}

BOOST_AUTO_TEST_CASE(newton_schulz_flops_formula) {
  // k = 4, l = 10: 5 · (4·16·10 + 2·64)
  BOOST_TEST(newton_schulz_flops(4, 10, 5) == 5.0 * (640 + 128));
  BOOST_TEST(newton_schulz_flops(10, 4, 5) == newton_schulz_flops(4, 10, 5));
}

BOOST_AUTO_TEST_CASE(muon_treats_hidden_matrices_and_experts_not_embeddings_head_norms) {
  auto p = [](const char* name, Shape s) { return make_parameter(name, std::move(s), InitSpec{}); };
  BOOST_TEST(muon_orthogonalizes(p("layers.0.attention.wq.weight", {8, 8})));
  BOOST_TEST(muon_orthogonalizes(p("layers.1.moe.experts.w1", {4, 6, 8})));
  BOOST_TEST(muon_orthogonalizes(p("layers.1.moe.router.gate.weight", {4, 8})));
  BOOST_TEST(!muon_orthogonalizes(p("tok_embeddings.weight", {32, 8})));
  BOOST_TEST(!muon_orthogonalizes(p("output.weight", {32, 8})));
  BOOST_TEST(!muon_orthogonalizes(p("layers.0.attention_norm.weight", {8})));
}

BOOST_AUTO_TEST_CASE(owners_are_balanced_and_whole_experts_stay_put) {
  // Four equal dense matrices over a shard group of 2 × tp 2: one each.
  std::vector<Parameter> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(make_parameter("w" + std::to_string(i), {16, 8}, InitSpec{}));
  for (Parameter& p : ps) split_tensor_parallel(p, 0, 2, 0);
  std::vector<const Parameter*> params;
  for (const Parameter& p : ps) params.push_back(&p);
  const std::vector<MuonMatrix> dense = plan_muon_matrices(params, {0, 0, 0, 0}, {{2, 0}}, 2, 5);
  std::vector<int> seen(4, 0);
  for (const MuonMatrix& m : dense) ++seen[size_t(m.s_owner * 2 + m.t_owner)];
  BOOST_TEST(seen == std::vector<int>({1, 1, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(dense[0].tp_split == 0);
  BOOST_TEST(dense[0].local_rows(1, 2) == 8);
  // Experts [4, 6, 8] over a shard group of 2: rank 0 holds experts 0-1, rank 1 experts 2-3
  // whole, so each expert stays with its holder (nothing moves in the gather).
  Parameter e = make_parameter("layers.0.moe.experts.w1", {4, 6, 8}, InitSpec{});
  const std::vector<MuonMatrix> ex = plan_muon_matrices({&e}, {0}, {{2, 1}}, 1, 5);
  BOOST_TEST(ex.size() == 4u);
  for (const MuonMatrix& m : ex) BOOST_TEST(m.s_owner == int(m.expert / 2));
  BOOST_TEST(ex[3].offset(0, 1) == 3 * 48);
}

BOOST_AUTO_TEST_CASE(single_rank_step_matches_the_formula) {
  // One rank, one step: W ← W(1 − lr·λ) − lr·0.2·√max(m, n)·NS(U) with U = (1 − μ)·G + μ·(1 − μ)·G.
  auto dev = make_device("cpu", 1);
  const ModelArgs a = testing::tiny_model_args(16, 1, 2, 2, 10);
  Transformer model(a, *dev);
  model.init_weights(3);
  for (Parameter* p : model.parameters())
    for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad.f32()[i] = std::sin(0.37f * float(i) + float(p->flat_offset));
  OptimizerSection cfg;
  cfg.name = "Muon";
  cfg.weight_decay = 0.1;
  Parameter* w = model.find("layers.0.attention.wo.weight");
  const int64_t rows = w->shape[0], cols = w->shape[1];
  Tensor expect = dev->empty({rows, cols}, DType::kF32, MemCategory::kTemporaries);
  const float mu = 0.95f, lr = 0.01f;
  for (int64_t i = 0; i < rows * cols; ++i) expect.f32()[i] = (1 - mu) * w->grad.f32()[i] * (1 + mu);
  newton_schulz_orthogonalize(*dev, expect, 5);
  std::vector<float> w0(w->value.f32(), w->value.f32() + rows * cols);
  const auto shards = replicated_shards(model);
  Muon opt(shards, *dev, cfg, MuonComms{});
  opt.step(lr, 1.0f);
  const double scale = 0.2 * std::sqrt(double(std::max(rows, cols)));
  double err = 0;
  for (int64_t i = 0; i < rows * cols; ++i)
    err = std::max(err, std::fabs(w->value.f32()[i] - (w0[size_t(i)] * (1 - lr * 0.1) - lr * scale * expect.f32()[i])));
  BOOST_TEST(err < 1e-6);
  BOOST_TEST(opt.state_names(*w) == std::vector<std::string>({"momentum_buffer"}), boost::test_tools::per_element());
  BOOST_TEST(opt.state_names(*model.find("norm.weight")).size() == 2u);
  BOOST_TEST(opt.step_count() == 1);
}
