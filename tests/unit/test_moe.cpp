// Mixture-of-Experts pieces on the CPU device: the dispatch plan, token places, the bias update
// against a hand computation, the router kernels against direct fp64 formulas (with finite
// differences for the backward), combine / gather, the grouped GEMM and its deferred weight term.
#define BOOST_TEST_MODULE moe
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <vector>

#include "device/cpu/cpu_device.hpp"
#include "model/layers/moe.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/layers/moe_exchange.hpp"
#include "model/weight_grad_queue.hpp"
#include "util/rng.hpp"

using namespace meshtrain;

namespace {

Tensor randn(Device& d, const Shape& s, uint64_t stream, float scale = 1.0f) {
  Tensor t = d.empty(s, DType::kF32, MemCategory::kTemporaries);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = scale * float(counter_normal(3, stream, uint64_t(i)));
  return t;
}

Tensor i32(Device& d, const std::vector<int32_t>& v, const Shape& s) {
  Tensor t = d.empty(s, DType::kI32, MemCategory::kTemporaries);
  d.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

// The router's gates in fp64 from logits, for fixed experts idx: the forward rule written out.
std::vector<double> gates_ref(const std::vector<double>& logits, int64_t n, int64_t e, const std::vector<int32_t>& idx,
                              int64_t k, const MoeRouting& r, std::vector<double>* scores = nullptr) {
  std::vector<double> s(size_t(n * e)), g(size_t(n * k));
  for (int64_t t = 0; t < n; ++t) {
    double m = -1e300, z = 0;
    for (int64_t i = 0; i < e; ++i) m = std::max(m, logits[size_t(t * e + i)]);
    for (int64_t i = 0; i < e; ++i) z += std::exp(logits[size_t(t * e + i)] - m);
    for (int64_t i = 0; i < e; ++i) {
      const double x = logits[size_t(t * e + i)];
      s[size_t(t * e + i)] = r.score_func == MoeScoreFunc::kSoftmax ? std::exp(x - m) / z : 1.0 / (1.0 + std::exp(-x));
    }
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[size_t(t * e + idx[size_t(t * k + j)])];
    for (int64_t j = 0; j < k; ++j) {
      const double v = s[size_t(t * e + idx[size_t(t * k + j)])];
      g[size_t(t * k + j)] = r.route_scale * (r.route_norm ? v / (sum + 1e-20) : v);
    }
  }
  if (scores) *scores = s;
  return g;
}

}  // namespace

BOOST_AUTO_TEST_CASE(dispatch_plan_is_a_stable_sort_by_expert) {
  // 4 tokens, top-2 of 3 experts.
  const std::vector<int32_t> topk = {2, 0, 0, 1, 2, 1, 0, 2};
  const MoeDispatchPlan p = plan_dispatch(topk.data(), 4, 2, 3);
  BOOST_TEST(p.counts == (std::vector<int64_t>{3, 2, 3}), boost::test_tools::per_element());
  // Expert 0: (t0, j1), (t1, j0), (t3, j0); expert 1: (t1, j1), (t2, j1); expert 2: (t0, j0), (t2, j0), (t3, j1).
  BOOST_TEST(p.src == (std::vector<int32_t>{0, 1, 3, 1, 2, 0, 2, 3}), boost::test_tools::per_element());
  BOOST_TEST(p.rows == (std::vector<int32_t>{5, 0, 1, 3, 6, 4, 2, 7}), boost::test_tools::per_element());
  const std::vector<int32_t> bad = {0, 3};
  BOOST_CHECK_THROW(plan_dispatch(bad.data(), 1, 2, 3), std::out_of_range);
}

BOOST_AUTO_TEST_CASE(token_places_follow_the_chunk_major_layout) {
  // T = 8, cp 2 head-tail: rank 1 holds chunks 1 and 2 (C = 2); B = 2 → rows [chunk, b, c].
  const SequenceShard sh = sequence_shard(8, 2, 1, CpBalancer::kHeadTail);
  const TokenPlaces all = token_places(sh, 2, 0, 8);
  BOOST_TEST(all.sample == (std::vector<int32_t>{0, 0, 1, 1, 0, 0, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(all.position == (std::vector<int64_t>{2, 3, 2, 3, 4, 5, 4, 5}), boost::test_tools::per_element());
  const TokenPlaces half = token_places(sh, 2, 4, 4);  // the second tp rank's rows under sequence parallelism
  BOOST_TEST(half.position == (std::vector<int64_t>{4, 5, 4, 5}), boost::test_tools::per_element());
  BOOST_CHECK_THROW(token_places(sh, 2, 6, 4), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(bias_update_matches_a_hand_computation) {
  // loads 1, 1, 4: mean 2, signs +1, +1, −1 → delta c·(1, 1, −1), centred by c/3.
  const double c = 0.01;
  const std::vector<float> b = update_expert_bias({0.5f, 0.0f, -0.25f}, {1, 1, 4}, c);
  BOOST_TEST(b[0] == 0.5 + 2 * c / 3, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(b[1] == 0.0 + 2 * c / 3, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(b[2] == -0.25 - 4 * c / 3, boost::test_tools::tolerance(1e-6));
  // A load equal to the mean does not move (sign 0).
  const std::vector<float> same = update_expert_bias({0, 0, 0}, {5, 5, 5}, c);
  BOOST_TEST(same == (std::vector<float>{0, 0, 0}), boost::test_tools::per_element());
  BOOST_CHECK_THROW(update_expert_bias({0, 0}, {1, 2, 3}, c), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(router_selects_by_biased_score_and_gates_by_unbiased) {
  CpuDevice dev(1);
  // One token, 4 experts, logits log(1..4): softmax scores 0.1, 0.2, 0.3, 0.4.
  Tensor logits = dev.empty({1, 4}, DType::kF32, MemCategory::kTemporaries);
  for (int i = 0; i < 4; ++i) logits.f32()[i] = std::log(float(i + 1));
  Tensor bias = dev.empty({4}, DType::kF32, MemCategory::kTemporaries);
  const float bv[4] = {0.25f, 0.0f, 0.0f, -0.2f};  // biased: 0.35, 0.2, 0.3, 0.2 (a tie of 1 and 3)
  for (int i = 0; i < 4; ++i) bias.f32()[i] = bv[i];
  Tensor scores = dev.empty({1, 4}, DType::kF32, MemCategory::kTemporaries);
  Tensor topk = dev.empty({1, 3}, DType::kI32, MemCategory::kTemporaries);
  Tensor gates = dev.empty({1, 3}, DType::kF32, MemCategory::kTemporaries);
  MoeRouting r;
  r.top_k = 3;
  r.route_norm = true;
  r.route_scale = 2.0f;
  dev.moe_router_forward(logits, bias, r, true, scores, topk, gates);
  BOOST_TEST(topk.i32()[0] == 0);
  BOOST_TEST(topk.i32()[1] == 2);
  BOOST_TEST(topk.i32()[2] == 1);  // the tie at 0.2 goes to the lower index
  const double sum = 0.1 + 0.3 + 0.2;
  BOOST_TEST(gates.f32()[0] == 2 * 0.1 / sum, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(gates.f32()[1] == 2 * 0.3 / sum, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(gates.f32()[2] == 2 * 0.2 / sum, boost::test_tools::tolerance(1e-6));
  r.top_k = 5;
  Tensor t5 = dev.empty({1, 5}, DType::kI32, MemCategory::kTemporaries), g5 = dev.empty({1, 5}, DType::kF32, MemCategory::kTemporaries);
  BOOST_CHECK_THROW(dev.moe_router_forward(logits, bias, r, true, scores, t5, g5), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(router_backward_matches_finite_differences) {
  CpuDevice dev(1);
  const int64_t n = 3, e = 5, k = 2;
  for (MoeScoreFunc f : {MoeScoreFunc::kSoftmax, MoeScoreFunc::kSigmoid})
    for (bool norm : {false, true}) {
      MoeRouting r;
      r.score_func = f;
      r.top_k = k;
      r.route_norm = norm;
      r.route_scale = 1.7f;
      Tensor logits = randn(dev, {n, e}, 1), dgates = randn(dev, {n, k}, 2), extra = randn(dev, {n, e}, 3, 0.3f);
      Tensor scores = dev.empty({n, e}, DType::kF32, MemCategory::kTemporaries);
      Tensor topk = dev.empty({n, k}, DType::kI32, MemCategory::kTemporaries);
      Tensor gates = dev.empty({n, k}, DType::kF32, MemCategory::kTemporaries);
      dev.moe_router_forward(logits, Tensor(), r, true, scores, topk, gates);
      Tensor dlogits = dev.empty({n, e}, DType::kF32, MemCategory::kTemporaries);
      dev.moe_router_backward(dgates, scores, topk, r, extra, dlogits);
      std::vector<int32_t> idx(topk.i32(), topk.i32() + n * k);
      // L = Σ dgates·gates + Σ extra·scores, differentiated numerically in fp64 (experts fixed).
      const auto objective = [&](const std::vector<double>& x) {
        std::vector<double> s;
        const std::vector<double> g = gates_ref(x, n, e, idx, k, r, &s);
        double v = 0;
        for (int64_t i = 0; i < n * k; ++i) v += double(dgates.f32()[i]) * g[size_t(i)];
        for (int64_t i = 0; i < n * e; ++i) v += double(extra.f32()[i]) * s[size_t(i)];
        return v;
      };
      std::vector<double> x(logits.f32(), logits.f32() + n * e);
      for (int64_t i = 0; i < n * e; ++i) {
        std::vector<double> hi = x, lo = x;
        hi[size_t(i)] += 1e-6;
        lo[size_t(i)] -= 1e-6;
        const double fd = (objective(hi) - objective(lo)) / 2e-6;
        BOOST_TEST(dlogits.f32()[i] == fd, boost::test_tools::tolerance(2e-4));
      }
    }
}

BOOST_AUTO_TEST_CASE(z_loss_value_and_gradient) {
  CpuDevice dev(1);
  const int64_t n = 2, e = 3;
  Tensor logits = randn(dev, {n, e}, 4);
  Tensor d = dev.zeros({n, e}, DType::kF32, MemCategory::kTemporaries);
  const double z = dev.moe_z_loss(logits, 0.5f, d);
  double ref = 0;
  for (int64_t t = 0; t < n; ++t) {
    double s = 0;
    for (int64_t i = 0; i < e; ++i) s += std::exp(double(logits.f32()[t * e + i]));
    const double lse = std::log(s);
    ref += lse * lse;
    for (int64_t i = 0; i < e; ++i)
      BOOST_TEST(d.f32()[t * e + i] == 0.5 * 2 * lse * std::exp(double(logits.f32()[t * e + i])) / s,
                 boost::test_tools::tolerance(1e-5));
  }
  BOOST_TEST(z == ref, boost::test_tools::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(balance_loss_statistics_and_gradient) {
  CpuDevice dev(1);
  const int64_t n = 4, e = 3;
  Tensor scores = dev.empty({n, e}, DType::kF32, MemCategory::kTemporaries);
  for (int64_t i = 0; i < n * e; ++i) scores.f32()[i] = 0.1f + 0.05f * float(i);
  Tensor sample = i32(dev, {1, 0, 1, 0}, {n});
  Tensor sums = dev.empty({2, e}, DType::kF32, MemCategory::kTemporaries);
  dev.moe_aux_stats(scores, sample, MoeScoreFunc::kSigmoid, sums);
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t i = 0; i < e; ++i) {
      double ref = 0;
      for (int64_t t = 0; t < n; ++t)
        if (sample.i32()[t] == s) {
          double z = 0;
          for (int64_t j = 0; j < e; ++j) z += scores.f32()[t * e + j];
          ref += scores.f32()[t * e + i] / z;
        }
      BOOST_TEST(sums.f32()[s * e + i] == ref, boost::test_tools::tolerance(1e-6));
    }
  // Gradient of Σ coef[sample, i]·s'[i] by finite differences of the normalization.
  Tensor coef = randn(dev, {2, e}, 5);
  Tensor ds = dev.empty({n, e}, DType::kF32, MemCategory::kTemporaries);
  dev.moe_aux_backward(coef, sample, scores, MoeScoreFunc::kSigmoid, ds);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < e; ++i) {
      const auto value = [&](double delta) {
        std::vector<double> s(scores.f32() + t * e, scores.f32() + (t + 1) * e);
        s[size_t(i)] += delta;
        double z = 0, v = 0;
        for (double x : s) z += x;
        for (int64_t j = 0; j < e; ++j) v += double(coef.f32()[sample.i32()[t] * e + j]) * s[size_t(j)] / z;
        return v;
      };
      BOOST_TEST(ds.f32()[t * e + i] == (value(1e-6) - value(-1e-6)) / 2e-6, boost::test_tools::tolerance(1e-4));
    }
  dev.moe_aux_backward(coef, sample, scores, MoeScoreFunc::kSoftmax, ds);  // softmax scores sum to 1: s' = s
  BOOST_TEST(ds.f32()[0] == coef.f32()[e]);
}

BOOST_AUTO_TEST_CASE(gather_combine_and_combine_backward) {
  CpuDevice dev(1);
  const int64_t n = 3, k = 2, d = 4, r = n * k;
  Tensor x = randn(dev, {n, d}, 6), y = randn(dev, {r, d}, 7), gates = randn(dev, {n, k}, 8), dout = randn(dev, {n, d}, 9);
  Tensor src = i32(dev, {2, 0, 1, 1, 0, 2}, {r});
  Tensor xs = dev.empty({r, d}, DType::kF32, MemCategory::kTemporaries);
  dev.gather_rows(x, src, xs);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t c = 0; c < d; ++c) BOOST_TEST(xs.f32()[i * d + c] == x.f32()[src.i32()[i] * d + c]);
  Tensor bad = i32(dev, {0, 0, 0, 0, 0, 3}, {r});
  BOOST_CHECK_THROW(dev.gather_rows(x, bad, xs), std::out_of_range);
  Tensor rows = i32(dev, {1, 4, 2, 3, 0, 5}, {n, k});  // a permutation of the routed rows
  Tensor out = dev.empty({n, d}, DType::kF32, MemCategory::kTemporaries);
  dev.moe_combine(y, rows, gates, out);
  Tensor dy = dev.empty({r, d}, DType::kF32, MemCategory::kTemporaries);
  Tensor dg = dev.empty({n, k}, DType::kF32, MemCategory::kTemporaries);
  dev.moe_combine_backward(dout, y, rows, gates, dy, dg);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      double ref = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = rows.i32()[t * k + j];
        ref += double(gates.f32()[t * k + j]) * y.f32()[row * d + c];
        BOOST_TEST(dy.f32()[row * d + c] == gates.f32()[t * k + j] * dout.f32()[t * d + c],
                   boost::test_tools::tolerance(1e-6f));
      }
      BOOST_TEST(out.f32()[t * d + c] == ref, boost::test_tools::tolerance(1e-5));
    }
    for (int64_t j = 0; j < k; ++j) {
      double ref = 0;
      for (int64_t c = 0; c < d; ++c) ref += double(dout.f32()[t * d + c]) * y.f32()[rows.i32()[t * k + j] * d + c];
      BOOST_TEST(dg.f32()[t * k + j] == ref, boost::test_tools::tolerance(1e-5));
    }
  }
}

BOOST_AUTO_TEST_CASE(grouped_matmul_equals_one_matmul_per_group) {
  CpuDevice dev(1);
  const int64_t p = 5, q = 3;
  const std::vector<int64_t> counts = {2, 0, 3, 1};  // an expert without tokens
  const int64_t g = int64_t(counts.size()), r = 6;
  Tensor w = randn(dev, {g, p, q}, 10), x = randn(dev, {r, q}, 11), dy = randn(dev, {r, p}, 12);
  Tensor y = dev.empty({r, p}, DType::kF32, MemCategory::kTemporaries);
  Tensor dx = dev.empty({r, q}, DType::kF32, MemCategory::kTemporaries);
  Tensor dw = randn(dev, {g, p, q}, 13);
  std::vector<float> dw0(dw.f32(), dw.f32() + dw.numel());
  dev.grouped_matmul(GroupedGemm::kForward, x, Tensor(), w, y, counts);
  dev.grouped_matmul(GroupedGemm::kBackwardInput, dy, Tensor(), w, dx, counts);
  dev.grouped_matmul(GroupedGemm::kBackwardWeight, dy, x, dw, Tensor(), counts);
  int64_t row = 0;
  for (int64_t e = 0; e < g; ++e) {
    for (int64_t i = row; i < row + counts[size_t(e)]; ++i) {
      for (int64_t a = 0; a < p; ++a) {
        double v = 0;
        for (int64_t b = 0; b < q; ++b) v += double(x.f32()[i * q + b]) * w.f32()[(e * p + a) * q + b];
        BOOST_TEST(y.f32()[i * p + a] == v, boost::test_tools::tolerance(1e-5));
      }
      for (int64_t b = 0; b < q; ++b) {
        double v = 0;
        for (int64_t a = 0; a < p; ++a) v += double(dy.f32()[i * p + a]) * w.f32()[(e * p + a) * q + b];
        BOOST_TEST(dx.f32()[i * q + b] == v, boost::test_tools::tolerance(1e-5));
      }
    }
    for (int64_t a = 0; a < p; ++a)
      for (int64_t b = 0; b < q; ++b) {
        double v = dw0[size_t((e * p + a) * q + b)];
        for (int64_t i = row; i < row + counts[size_t(e)]; ++i) v += double(dy.f32()[i * p + a]) * x.f32()[i * q + b];
        BOOST_TEST(dw.f32()[(e * p + a) * q + b] == v, boost::test_tools::tolerance(1e-5));
      }
    row += counts[size_t(e)];
  }
  BOOST_CHECK_THROW(dev.grouped_matmul(GroupedGemm::kForward, x, Tensor(), w, y, {2, 0, 3}), std::invalid_argument);
  BOOST_CHECK_THROW(dev.grouped_matmul(GroupedGemm::kForward, x, Tensor(), w, y, {2, 0, 3, 2}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(deferred_grouped_weight_term_is_bitwise_the_direct_one) {
  CpuDevice dev(2);
  const std::vector<int64_t> counts = {3, 1, 0};
  Parameter w = make_parameter("layers.0.moe.experts.w2", {3, 4, 5}, InitSpec{});
  Tensor grad_a = dev.zeros({3, 4, 5}, DType::kF32, MemCategory::kGradients);
  Tensor grad_b = dev.zeros({3, 4, 5}, DType::kF32, MemCategory::kGradients);
  Tensor dy = randn(dev, {4, 4}, 14), x = randn(dev, {4, 5}, 15);
  dev.grouped_matmul(GroupedGemm::kBackwardWeight, dy, x, grad_a, Tensor(), counts);
  WeightGradQueue q;
  q.grouped_linear(dy, x, counts, w);
  w.grad = grad_b;
  q.run(dev);
  for (int64_t i = 0; i < grad_a.numel(); ++i) BOOST_TEST(grad_a.f32()[i] == grad_b.f32()[i]);
  BOOST_CHECK_THROW(q.grouped_linear(dy, x, {3, 1}, w), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(moe_flavors_have_the_published_sizes) {
  // Qwen3-30B-A3B: 30.5 B total, 3.3 B activated; Mixtral 8x7B: 46.7 B, 12.9 B (model cards).
  const ModelArgs q = model_flavor("qwen3", "30B-A3B"), m = model_flavor("mixtral", "8x7B");
  BOOST_TEST(q.num_params() == 30532122624LL);
  BOOST_TEST(q.active_params() == 3353032704LL);
  BOOST_TEST(m.num_params() == 46702792704LL);
  BOOST_TEST(m.active_params() == 12879925248LL);
  // Active FLOPs: 6 × active matmul parameters + the attention term.
  BOOST_TEST(m.flops_per_token(1) == 6.0 * double(m.active_matmul_params()) + 12.0 * 32 * 32 * 128);
  // The dense-block pattern: the first n dense, then every step-th block.
  ModelArgs p = m;
  p.n_layers = 8;
  p.n_dense_layers = 1;
  p.moe_layer_step = 2;
  BOOST_TEST(p.num_moe_layers() == 4);  // blocks 1, 3, 5, 7
  BOOST_TEST(!p.is_moe_layer(0));
  BOOST_TEST(p.is_moe_layer(1));
  BOOST_TEST(!p.is_moe_layer(2));
}

BOOST_AUTO_TEST_CASE(ep_exchange_orders_rows_by_local_expert_then_source) {
  // ep 2, 4 experts (2 per rank). This rank (say rank 1) sends counts {1, 0 | 2, 3}: 1 row to
  // rank 0, 5 rows to itself; it receives from rank 0 {4, 1} and from itself {2, 3} for its
  // experts 2 and 3.
  const EpExchange x = make_ep_exchange({1, 0, 2, 3}, {4, 1, 2, 3}, 2);
  BOOST_TEST(x.send_rows == (std::vector<int64_t>{1, 5}), boost::test_tools::per_element());
  BOOST_TEST(x.recv_rows == (std::vector<int64_t>{5, 5}), boost::test_tools::per_element());
  BOOST_TEST(x.local_counts == (std::vector<int64_t>{6, 4}), boost::test_tools::per_element());
  BOOST_TEST(x.rows_in == 10);
  // Arrival order: (src 0, e2) rows 0-3, (src 0, e3) row 4, (src 1, e2) rows 5-6, (src 1, e3) rows 7-9.
  // Expert order: e2 from src 0 (0-3), e2 from src 1 (5, 6), e3 from src 0 (4), e3 from src 1 (7-9).
  BOOST_TEST(x.perm == (std::vector<int32_t>{0, 1, 2, 3, 5, 6, 4, 7, 8, 9}), boost::test_tools::per_element());
  for (int64_t i = 0; i < x.rows_in; ++i) BOOST_TEST(x.inv_perm[size_t(x.perm[size_t(i)])] == i);
  BOOST_CHECK_THROW(make_ep_exchange({1, 2, 3}, {1, 2, 3}, 2), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(expert_parallel_split_and_global_indices) {
  Parameter w = make_parameter("layers.0.moe.experts.w1", {8, 3, 2}, InitSpec{});
  split_expert_parallel(w, 4, 3);  // experts 6 and 7
  BOOST_TEST(w.local_shape == (Shape{2, 3, 2}), boost::test_tools::per_element());
  BOOST_TEST(w.sharding.ep_first == 6);
  BOOST_TEST(global_flat_index(w, 0) == 6 * 6);
  BOOST_TEST(global_flat_index(w, 11) == 6 * 6 + 11);
  Parameter bad = make_parameter("x", {6, 2}, InitSpec{});
  BOOST_CHECK_THROW(split_expert_parallel(bad, 4, 0), std::invalid_argument);
}
