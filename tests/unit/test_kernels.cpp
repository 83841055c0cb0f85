#define BOOST_TEST_MODULE kernels
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "device/cpu/cpu_device.hpp"
#include "util/rng.hpp"

using namespace meshtrain;

namespace {

Tensor randn(Device& d, const Shape& s, uint64_t stream, float std = 1.0f) {
  Tensor t = d.empty(s, DType::kF32, MemCategory::kTemporaries);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = float(counter_normal(99, stream, uint64_t(i))) * std;
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.f32()[i]) * b.f32()[i];
  return s;
}

// Directional finite difference of f along a random direction dx vs the analytic <grad, dx>.
template <class F>
void check_directional(Tensor x, const Tensor& grad, F f, double tol) {
  CpuDevice d(1);
  Tensor dir = randn(d, x.shape(), 4242);
  const float h = 1e-2f;
  std::vector<float> saved(x.f32(), x.f32() + x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = saved[i] + h * dir.f32()[i];
  const double fp = f();
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = saved[i] - h * dir.f32()[i];
  const double fm = f();
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = saved[i];
  const double numeric = (fp - fm) / (2 * h), analytic = dot(grad, dir);
  BOOST_TEST(std::fabs(numeric - analytic) <= tol * std::max(1.0, std::fabs(analytic)),
             "numeric " << numeric << " analytic " << analytic);
}

}  // namespace

BOOST_AUTO_TEST_CASE(allocator_accounts_and_reuses) {
  CpuDevice d(1);
  auto* a = d.allocator();
  void* p1 = nullptr;
  {
    Tensor t = d.empty({1000}, DType::kF32, MemCategory::kActivations);
    p1 = t.raw();
    BOOST_TEST(a->stats().in_use[int(MemCategory::kActivations)] == 4000);
  }
  BOOST_TEST(a->stats().in_use[int(MemCategory::kActivations)] == 0);
  BOOST_TEST(a->stats().peak[int(MemCategory::kActivations)] == 4000);
  Tensor t2 = d.empty({1000}, DType::kF32, MemCategory::kGradients);
  BOOST_TEST(t2.raw() == p1);  // served from the cache
  BOOST_TEST(a->stats().total_peak == 4000);
  BOOST_CHECK_THROW(t2.view({1001}), std::out_of_range);
  BOOST_CHECK_THROW(t2.i32(), std::logic_error);
}

BOOST_AUTO_TEST_CASE(allocator_limit_refuses_past_it_after_releasing_the_cache) {
  CpuDevice d(1);
  auto* a = d.allocator();
  a->set_limit(16000, "[training] memory_limit_gib = test");
  { Tensor small = d.empty({1000}, DType::kF32, MemCategory::kTemporaries); }  // 4000 B, cached after
  // 12000 B (rounded to 12288) fits only once the cached 4096 are returned to the backend.
  Tensor big = d.empty({3000}, DType::kF32, MemCategory::kActivations);
  BOOST_TEST(a->stats().reserved_bytes == 12288);
  try {
    Tensor more = d.empty({2000}, DType::kF32, MemCategory::kCommunication);
    BOOST_FAIL("no OutOfMemory");
  } catch (const OutOfMemory& e) {
    const std::string w = e.what();
    BOOST_TEST(w.find("of communication would take this rank's memory to 0.0") != std::string::npos, w);
    BOOST_TEST(w.find("over the limit of 0.0 MiB ([training] memory_limit_gib = test); in use: activations") !=
                   std::string::npos, w);
  }
  a->set_limit(0, "");
  Tensor more = d.empty({2000}, DType::kF32, MemCategory::kCommunication);  // no cap any more
  BOOST_TEST(a->stats().reserved_bytes > 16000);
}

BOOST_AUTO_TEST_CASE(matmul_matches_naive) {
  CpuDevice d(2);
  Tensor a = randn(d, {5, 7}, 1), b = randn(d, {3, 7}, 2), c = d.empty({5, 3}, DType::kF32, MemCategory::kTemporaries);
  d.matmul(a, false, b, true, c, 1.0f, 0.0f);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) {
      double s = 0;
      for (int k = 0; k < 7; ++k) s += double(a.f32()[i * 7 + k]) * b.f32()[j * 7 + k];
      BOOST_TEST(std::fabs(c.f32()[i * 3 + j] - s) < 1e-5);
    }
  BOOST_CHECK_THROW(d.matmul(a, false, b, false, c, 1, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(attention_forward_matches_naive_softmax) {
  CpuDevice d(2);
  const int64_t B = 2, T = 5, Hq = 4, Hkv = 2, Dh = 3;
  Tensor q = randn(d, {B, T, Hq, Dh}, 1), k = randn(d, {B, T, Hkv, Dh}, 2), v = randn(d, {B, T, Hkv, Dh}, 3);
  Tensor o = d.empty(q.shape(), DType::kF32, MemCategory::kTemporaries), lse = d.empty({B, Hq, T}, DType::kF32, MemCategory::kTemporaries);
  const float scale = 0.7f;
  d.attention_forward(q, k, v, o, lse, scale);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e30, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < Dh; ++c) acc += double(q.f32()[((b * T + i) * Hq + h) * Dh + c]) * k.f32()[((b * T + j) * Hkv + h / 2) * Dh + c];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        for (auto& x : s) z += std::exp(x - mx);
        for (int64_t c = 0; c < Dh; ++c) {
          double out = 0;
          for (int64_t j = 0; j <= i; ++j) out += std::exp(s[j] - mx) / z * v.f32()[((b * T + j) * Hkv + h / 2) * Dh + c];
          BOOST_TEST(std::fabs(o.f32()[((b * T + i) * Hq + h) * Dh + c] - out) < 1e-5);
        }
        BOOST_TEST(std::fabs(lse.f32()[(b * Hq + h) * T + i] - (mx + std::log(z))) < 1e-5);
      }
}

BOOST_AUTO_TEST_CASE(attention_backward_finite_difference) {
  CpuDevice d(2);
  const int64_t B = 1, T = 6, Hq = 4, Hkv = 2, Dh = 4;
  Tensor q = randn(d, {B, T, Hq, Dh}, 1), k = randn(d, {B, T, Hkv, Dh}, 2), v = randn(d, {B, T, Hkv, Dh}, 3);
  Tensor w = randn(d, {B, T, Hq, Dh}, 5);  // loss = <w, out>
  Tensor o = d.empty(q.shape(), DType::kF32, MemCategory::kTemporaries), lse = d.empty({B, Hq, T}, DType::kF32, MemCategory::kTemporaries);
  auto loss = [&] {
    d.attention_forward(q, k, v, o, lse, 0.5f);
    return dot(w, o);
  };
  loss();
  Tensor dq = d.empty(q.shape(), DType::kF32, MemCategory::kTemporaries), dk = d.empty(k.shape(), DType::kF32, MemCategory::kTemporaries),
         dv = d.empty(v.shape(), DType::kF32, MemCategory::kTemporaries);
  d.attention_backward(w, q, k, v, o, lse, 0.5f, dq, dk, dv);
  check_directional(q, dq, loss, 2e-3);
  check_directional(k, dk, loss, 2e-3);
  check_directional(v, dv, loss, 2e-3);
}

BOOST_AUTO_TEST_CASE(rmsnorm_swiglu_cross_entropy_gradients) {
  CpuDevice d(2);
  Tensor x = randn(d, {4, 8}, 1), w = randn(d, {8}, 2), g = randn(d, {4, 8}, 3);
  Tensor y = d.empty(x.shape(), DType::kF32, MemCategory::kTemporaries), r = d.empty({4}, DType::kF32, MemCategory::kTemporaries);
  auto norm_loss = [&] {
    d.rmsnorm_forward(x, w, 1e-5f, y, r);
    return dot(g, y);
  };
  norm_loss();
  Tensor dx = d.empty(x.shape(), DType::kF32, MemCategory::kTemporaries), dw = d.zeros({8}, DType::kF32, MemCategory::kTemporaries);
  d.rmsnorm_backward(g, x, w, r, dx, dw);
  check_directional(x, dx, norm_loss, 2e-3);
  check_directional(w, dw, norm_loss, 2e-3);

  Tensor a = randn(d, {3, 5}, 6), b = randn(d, {3, 5}, 7), gy = randn(d, {3, 5}, 8);
  Tensor h = d.empty(a.shape(), DType::kF32, MemCategory::kTemporaries);
  auto glu_loss = [&] {
    d.swiglu_forward(a, b, h);
    return dot(gy, h);
  };
  Tensor da = d.empty(a.shape(), DType::kF32, MemCategory::kTemporaries), db = d.empty(b.shape(), DType::kF32, MemCategory::kTemporaries);
  d.swiglu_backward(gy, a, b, da, db);
  check_directional(a, da, glu_loss, 2e-3);
  check_directional(b, db, glu_loss, 2e-3);

  Tensor logits = randn(d, {4, 11}, 9), targets = d.empty({4}, DType::kI32, MemCategory::kTemporaries);
  for (int i = 0; i < 4; ++i) targets.i32()[i] = (i * 5) % 11;
  Tensor dl = d.empty(logits.shape(), DType::kF32, MemCategory::kTemporaries);
  d.cross_entropy(logits, targets, dl, 1.0f);
  check_directional(logits, dl, [&] { return d.cross_entropy(logits, targets, Tensor(), 0.0f); }, 2e-3);
  targets.i32()[0] = 11;
  BOOST_CHECK_THROW(d.cross_entropy(logits, targets, Tensor(), 0.0f), std::out_of_range);
}

// A split backward (dx now, dW later by rmsnorm_backward_weight) must reproduce the fused
// kernels bit for bit: same dx with dW skipped, same dW accumulated onto a nonzero gradient,
// for row counts that do not divide by the thread count and widths off the SIMD width.
BOOST_AUTO_TEST_CASE(rmsnorm_backward_weight_matches_fused_bitwise) {
  for (int threads : {1, 2, 3})
    for (auto [n, dim] : {std::pair<int64_t, int64_t>{4, 8}, {37, 19}, {64, 128}})
      for (bool residual : {false, true}) {
        CpuDevice d(threads);
        Tensor x = randn(d, {n, dim}, 11), w = randn(d, {dim}, 12), dy = randn(d, {n, dim}, 13);
        Tensor res = randn(d, {n, dim}, 14), start = randn(d, {dim}, 15);
        Tensor y = d.empty(x.shape(), DType::kF32, MemCategory::kTemporaries);
        Tensor r = d.empty({n}, DType::kF32, MemCategory::kTemporaries);
        d.rmsnorm_forward(x, w, 1e-5f, y, r);
        auto run = [&](bool split, Tensor& dx, Tensor& dw) {
          dx = d.empty(x.shape(), DType::kF32, MemCategory::kTemporaries);
          dw = d.empty({dim}, DType::kF32, MemCategory::kTemporaries);
          d.copy(dw, start);
          const Tensor fused_dw = split ? Tensor() : dw;
          if (residual)
            d.rmsnorm_backward_residual(dy, x, w, r, res, dx, fused_dw);
          else
            d.rmsnorm_backward(dy, x, w, r, dx, fused_dw);
          if (split) d.rmsnorm_backward_weight(dy, x, r, dw);
        };
        Tensor dx_fused, dw_fused, dx_split, dw_split;
        run(false, dx_fused, dw_fused);
        run(true, dx_split, dw_split);
        const std::string what = "threads " + std::to_string(threads) + " [" + std::to_string(n) + ", " +
                                 std::to_string(dim) + "]" + (residual ? " residual" : "");
        BOOST_TEST(std::memcmp(dx_fused.raw(), dx_split.raw(), dx_fused.nbytes()) == 0, "dx differs: " << what);
        BOOST_TEST(std::memcmp(dw_fused.raw(), dw_split.raw(), dw_fused.nbytes()) == 0, "dw differs: " << what);
        BOOST_TEST(std::memcmp(dw_fused.raw(), start.raw(), start.nbytes()) != 0, "dw not accumulated: " << what);
      }
  CpuDevice d(2);
  Tensor x = randn(d, {4, 8}, 1), r = randn(d, {4}, 2), dw = d.zeros({8}, DType::kF32, MemCategory::kTemporaries);
  BOOST_CHECK_THROW(d.rmsnorm_backward_weight(randn(d, {4, 7}, 3), x, r, dw), std::invalid_argument);
  BOOST_CHECK_THROW(d.rmsnorm_backward_weight(x, x, randn(d, {3}, 4), dw), std::invalid_argument);
  BOOST_CHECK_THROW(d.rmsnorm_backward_weight(x, x, r, randn(d, {7}, 5)), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(rope_inverse_undoes_forward) {
  CpuDevice d(2);
  Tensor x = randn(d, {2, 3, 2, 4}, 1), cos = randn(d, {3, 2}, 2), sin = randn(d, {3, 2}, 3);
  for (int64_t i = 0; i < 6; ++i) {  // a valid rotation table
    const double ang = cos.f32()[i];
    cos.f32()[i] = float(std::cos(ang));
    sin.f32()[i] = float(std::sin(ang));
  }
  std::vector<float> orig(x.f32(), x.f32() + x.numel());
  d.rope(x, cos, sin, false);
  BOOST_TEST(std::fabs(x.f32()[0] - orig[0]) > 1e-6);
  d.rope(x, cos, sin, true);
  for (int64_t i = 0; i < x.numel(); ++i) BOOST_TEST(std::fabs(x.f32()[i] - orig[i]) < 1e-5);
}

BOOST_AUTO_TEST_CASE(reductions_do_not_depend_on_thread_count) {
  CpuDevice d1(1), d2(2);
  Tensor x1 = randn(d1, {100003}, 1);
  const double s1 = d1.sum_squares(x1);
  const double s2 = d2.sum_squares(x1);
  BOOST_TEST(s1 == s2);  // bitwise: fixed blocks summed in a fixed order
}

BOOST_AUTO_TEST_CASE(scale_to_unit_norm_is_sum_squares_then_scale) {
  // Newton–Schulz's normalization (Muon): the norm, eps added, as one device call.
  CpuDevice d(2);
  Tensor x = randn(d, {1031}, 7);
  std::vector<float> want(x.f32(), x.f32() + x.numel());
  const float factor = float(1.0 / (std::sqrt(d.sum_squares(x)) + 1e-7));
  for (float& v : want) v *= factor;
  d.scale_to_unit_norm(x, 1e-7);
  BOOST_TEST(std::memcmp(x.f32(), want.data(), want.size() * sizeof(float)) == 0);
  BOOST_TEST(std::fabs(std::sqrt(d.sum_squares(x)) - 1.0) < 1e-6);
  Tensor empty = d.empty({0}, DType::kF32, MemCategory::kTemporaries);
  d.scale_to_unit_norm(empty, 1e-7);  // nothing to scale
}
