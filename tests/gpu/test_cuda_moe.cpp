// CudaDevice Mixture-of-Experts kernels (moe.cu) against the CpuDevice reference (cpu_moe.cpp):
// router forward (softmax and sigmoid, route_norm on and off, route_scale ≠ 1, with and without
// a selection bias, top-k chosen or given, exact ties), router backward (dscores_extra defined
// and undefined), z-loss with and without dlogits, the sequence-wise balance statistics and
// their gradient (rows of a sample scattered, several 256-row chunks), gather_rows, moe_combine
// and its backward, and Device::grouped_matmul's three forms (the default implementation over
// cuBLASLt). Router tensors are f32 (≤ 1e-5 normwise), activations f32 (≤ 1e-5) or bf16 (inputs
// rounded to bf16 for both devices, ≤ 1e-2); chosen experts must agree exactly. Outputs are
// poisoned with NaN first; deterministic kernels are also run twice and compared bitwise.
#include "gpu_test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace meshtrain;
using namespace meshtrain::gputest;

namespace {

const DType kDtypes[] = {DType::kF32, DType::kBF16};
const MoeScoreFunc kScoreFuncs[] = {MoeScoreFunc::kSoftmax, MoeScoreFunc::kSigmoid};
constexpr MemCategory kTmp = MemCategory::kTemporaries;

const char* func_name(MoeScoreFunc f) { return f == MoeScoreFunc::kSoftmax ? "softmax" : "sigmoid"; }

std::string describe(const char* what, int64_t n, int64_t e, const MoeRouting& r, bool bias) {
  return std::string(what) + " N=" + std::to_string(n) + " E=" + std::to_string(e) + " k=" + std::to_string(r.top_k) +
         " " + func_name(r.score_func) + (r.route_norm ? " norm" : "") + " scale=" + std::to_string(r.route_scale) +
         (bias ? " bias" : "");
}

/// An i32 pair holding v on both devices.
Pair int_pair(const Shape& s, const std::vector<int32_t>& v) {
  Pair p{cpu().empty(s, DType::kI32, kTmp), gpu().empty(s, DType::kI32, kTmp)};
  cpu().upload(p.c, v.data(), v.size() * 4);
  gpu().upload(p.g, v.data(), v.size() * 4);
  return p;
}

/// An i32 output pair: CPU zeros, GPU poisoned (0xFF bytes read as −1, never a valid index).
Pair int_output_pair(const Shape& s) {
  Pair p{cpu().zeros(s, DType::kI32, kTmp), gpu().empty(s, DType::kI32, kTmp)};
  poison(p.g);
  return p;
}

std::vector<int32_t> ints(Device& dev, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  dev.download(v.data(), t, t.nbytes());
  return v;
}

/// The values of a CPU f32 tensor in a new GPU tensor of dtype dt (its pair, same values).
Pair with_gpu_copy(const Tensor& c, DType dt = DType::kF32) {
  Pair p{c, gpu().empty(c.shape(), dt, kTmp)};
  set_values(gpu(), p.g, host_values(cpu(), c));
  return p;
}

void check_scalar(double g, double c, double tolerance, const std::string& what) {
  const double rel = std::fabs(g - c) / std::max(std::fabs(c), 1e-300);
  BOOST_TEST_MESSAGE(what << ": gpu " << g << " cpu " << c << " rel " << rel);
  BOOST_CHECK_MESSAGE(rel <= tolerance, what << ": gpu " << g << " vs cpu " << c);
}

/// A random permutation of [0, n).
std::vector<int32_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  std::mt19937_64 g(seed);
  std::shuffle(v.begin(), v.end(), g);
  return v;
}

/// n values uniform in [lo, hi).
std::vector<int32_t> random_ints(int64_t n, int lo, int hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

/// Scores as the router makes them (the CPU forward of random logits), on both devices.
Pair router_scores(int64_t n, int64_t e, MoeScoreFunc f, uint64_t seed) {
  Tensor logits = cpu().empty({n, e}, DType::kF32, kTmp);
  set_values(cpu(), logits, randn(n * e, seed, 2.0f));
  Tensor scores = cpu().empty({n, e}, DType::kF32, kTmp);
  Tensor topk = cpu().empty({n, 1}, DType::kI32, kTmp), gates = cpu().empty({n, 1}, DType::kF32, kTmp);
  cpu().moe_router_forward(logits, Tensor(), MoeRouting{f, 1, false, 1.0f}, true, scores, topk, gates);
  return with_gpu_copy(scores);
}

struct RouterCase {
  int64_t n, e, k;
};
// k = E, E = 1, E not a multiple of the warp, E beyond 32 · k, and many rows per warp.
const RouterCase kRouterCases[] = {{37, 8, 2},  {300, 64, 6}, {129, 256, 8}, {64, 512, 16},
                                   {5, 1, 1},   {19, 37, 37}, {1000, 128, 8}};

/// The GPU's chosen experts against the CPU's. With `exact` they must be identical; otherwise a
/// slot may differ where the CPU's biased scores of the two experts agree to 1e-6 relative: the
/// scores themselves may differ by an ulp between the devices (expf, summation order), which
/// can order a near-tie either way. Either way every row's experts must be distinct and in [0, E).
void expect_topk(const Pair& topk, const Pair& scores, const Pair* bias, bool exact, const std::string& what) {
  const int64_t n = topk.c.dim(0), k = topk.c.dim(1), e = scores.c.dim(1);
  const std::vector<int32_t> g = ints(gpu(), topk.g), c = ints(cpu(), topk.c);
  const std::vector<float> s = host_values(cpu(), scores.c);
  const std::vector<float> b = bias ? host_values(cpu(), bias->c) : std::vector<float>(size_t(e), 0.0f);
  size_t wrong = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<char> seen(size_t(e), 0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t gi = g[size_t(t * k + j)], ci = c[size_t(t * k + j)];
      if (gi < 0 || gi >= e || seen[size_t(gi)]) {
        ++wrong;
        continue;
      }
      seen[size_t(gi)] = 1;
      if (gi == ci) continue;
      const float vg = s[size_t(t * e + gi)] + b[size_t(gi)], vc = s[size_t(t * e + ci)] + b[size_t(ci)];
      if (exact || !(std::fabs(vg - vc) <= 1e-6f * std::max(1.0f, std::fabs(vc)))) ++wrong;
    }
  }
  BOOST_CHECK_MESSAGE(wrong == 0, what << ": " << wrong << " of " << c.size() << " chosen experts differ");
}

/// One router forward with selection on both devices; compares scores, topk and gates.
void check_router_forward(const Pair& logits, const Pair* bias, const MoeRouting& r, bool exact,
                          const std::string& what) {
  const int64_t n = logits.c.dim(0), e = logits.c.dim(1), k = r.top_k;
  Pair scores = output_pair({n, e}, DType::kF32), gates = output_pair({n, k}, DType::kF32);
  Pair topk = int_output_pair({n, k});
  cpu().moe_router_forward(logits.c, bias ? bias->c : Tensor(), r, true, scores.c, topk.c, gates.c);
  gpu().moe_router_forward(logits.g, bias ? bias->g : Tensor(), r, true, scores.g, topk.g, gates.g);
  expect_close(scores, DType::kF32, what + " scores");
  expect_topk(topk, scores, bias, exact, what + " topk");
  expect_close(gates, DType::kF32, what + " gates");
}

}  // namespace

// ---- router ----

BOOST_AUTO_TEST_CASE(moe_router_forward_matches_cpu) {
  uint64_t seed = 100;
  for (const RouterCase& cs : kRouterCases)
    for (MoeScoreFunc f : kScoreFuncs)
      for (bool norm : {false, true})
        for (float scale : {1.0f, 2.5f})
          for (bool with_bias : {false, true}) {
            const MoeRouting r{f, cs.k, norm, scale};
            Pair logits = random_pair({cs.n, cs.e}, DType::kF32, ++seed, 2.0f);
            Pair bias = random_pair({cs.e}, DType::kF32, ++seed, 0.05f);
            check_router_forward(logits, with_bias ? &bias : nullptr, r, false,
                                 describe("moe_router_forward", cs.n, cs.e, r, with_bias));
          }
}

BOOST_AUTO_TEST_CASE(moe_router_forward_ties_go_to_the_lower_expert) {
  // Logits on a 0.5 grid (many exactly equal scores per row), all-equal rows, and a bias of 0
  // or −inf (experts that may only fill up the last slots, lowest index first).
  uint64_t seed = 200;
  for (const RouterCase& cs : {RouterCase{64, 8, 6}, RouterCase{50, 64, 8}, RouterCase{33, 40, 40}})
    for (MoeScoreFunc f : kScoreFuncs)
      for (bool with_bias : {false, true}) {
        std::vector<float> x = randn(cs.n * cs.e, ++seed);
        for (auto& v : x) v = std::round(v * 2.0f) / 2.0f;
        for (int64_t i = 0; i < cs.e; ++i) x[size_t(i)] = 0.0f;  // row 0: one big tie
        Pair logits = make_pair({cs.n, cs.e}, DType::kF32, x);
        std::vector<float> b(size_t(cs.e), 0.0f);
        for (int64_t i = 1; i < cs.e; i += 3) b[size_t(i)] = -std::numeric_limits<float>::infinity();
        Pair bias = make_pair({cs.e}, DType::kF32, b);
        const MoeRouting r{f, cs.k, true, 1.0f};
        // Distinct logits are ≥ 0.5 apart: the devices' scores cannot reorder them, so the
        // experts must match exactly.
        check_router_forward(logits, with_bias ? &bias : nullptr, r, true,
                             describe("moe_router_forward ties", cs.n, cs.e, r, with_bias));
      }
}

BOOST_AUTO_TEST_CASE(moe_router_forward_given_topk_matches_cpu) {
  uint64_t seed = 300;
  for (const RouterCase& cs : kRouterCases)
    for (MoeScoreFunc f : kScoreFuncs)
      for (bool norm : {false, true}) {
        const MoeRouting r{f, cs.k, norm, 1.5f};
        std::vector<int32_t> idx;
        for (int64_t t = 0; t < cs.n; ++t) {
          const std::vector<int32_t> p = permutation(cs.e, ++seed);
          idx.insert(idx.end(), p.begin(), p.begin() + cs.k);
        }
        Pair topk = int_pair({cs.n, cs.k}, idx);
        Pair logits = random_pair({cs.n, cs.e}, DType::kF32, ++seed, 2.0f);
        Pair bias = random_pair({cs.e}, DType::kF32, ++seed, 0.05f);  // must not matter
        Pair scores = output_pair({cs.n, cs.e}, DType::kF32), gates = output_pair({cs.n, cs.k}, DType::kF32);
        const std::string what = describe("moe_router_forward given topk", cs.n, cs.e, r, true);
        cpu().moe_router_forward(logits.c, bias.c, r, false, scores.c, topk.c, gates.c);
        gpu().moe_router_forward(logits.g, bias.g, r, false, scores.g, topk.g, gates.g);
        expect_close(scores, DType::kF32, what + " scores");
        expect_close(gates, DType::kF32, what + " gates");
        BOOST_CHECK_MESSAGE(ints(gpu(), topk.g) == idx, what << ": topk was modified");
      }
}

BOOST_AUTO_TEST_CASE(moe_router_forward_is_deterministic) {
  const int64_t n = 500, e = 256;
  const MoeRouting r{MoeScoreFunc::kSigmoid, 8, true, 2.5f};
  Pair logits = random_pair({n, e}, DType::kF32, 7, 2.0f), bias = random_pair({e}, DType::kF32, 8, 0.05f);
  Tensor s[2], t[2], g[2];
  for (int i = 0; i < 2; ++i) {
    s[i] = gpu().empty({n, e}, DType::kF32, kTmp);
    t[i] = gpu().empty({n, 8}, DType::kI32, kTmp);
    g[i] = gpu().empty({n, 8}, DType::kF32, kTmp);
    gpu().moe_router_forward(logits.g, bias.g, r, true, s[i], t[i], g[i]);
  }
  BOOST_CHECK(same_bytes(s[0], s[1]));
  BOOST_CHECK(same_bytes(t[0], t[1]));
  BOOST_CHECK(same_bytes(g[0], g[1]));
}

BOOST_AUTO_TEST_CASE(moe_router_backward_matches_cpu) {
  uint64_t seed = 400;
  for (const RouterCase& cs : kRouterCases)
    for (MoeScoreFunc f : kScoreFuncs)
      for (bool norm : {false, true})
        for (float scale : {1.0f, 2.5f})
          for (bool extra : {false, true}) {
            const MoeRouting r{f, cs.k, norm, scale};
            // The forward's scores and topk, identical on both devices.
            Tensor logits = cpu().empty({cs.n, cs.e}, DType::kF32, kTmp);
            set_values(cpu(), logits, randn(cs.n * cs.e, ++seed, 2.0f));
            Tensor scores_c = cpu().empty({cs.n, cs.e}, DType::kF32, kTmp);
            Tensor topk_c = cpu().empty({cs.n, cs.k}, DType::kI32, kTmp);
            Tensor gates_c = cpu().empty({cs.n, cs.k}, DType::kF32, kTmp);
            cpu().moe_router_forward(logits, Tensor(), r, true, scores_c, topk_c, gates_c);
            Pair scores = with_gpu_copy(scores_c);
            Pair topk = int_pair({cs.n, cs.k}, ints(cpu(), topk_c));
            Pair dgates = random_pair({cs.n, cs.k}, DType::kF32, ++seed);
            Pair dextra = random_pair({cs.n, cs.e}, DType::kF32, ++seed, 0.1f);
            Pair dlogits = output_pair({cs.n, cs.e}, DType::kF32);
            cpu().moe_router_backward(dgates.c, scores.c, topk.c, r, extra ? dextra.c : Tensor(), dlogits.c);
            gpu().moe_router_backward(dgates.g, scores.g, topk.g, r, extra ? dextra.g : Tensor(), dlogits.g);
            expect_close(dlogits, DType::kF32,
                         describe("moe_router_backward", cs.n, cs.e, r, false) + (extra ? " dscores_extra" : ""));
          }
}

// ---- z-loss ----

BOOST_AUTO_TEST_CASE(moe_z_loss_matches_cpu_and_is_deterministic) {
  uint64_t seed = 500;
  for (const RouterCase& cs : kRouterCases) {
    const float grad_scale = 1.0f / float(cs.n);
    Pair logits = random_pair({cs.n, cs.e}, DType::kF32, ++seed, 3.0f);
    const std::string what = "moe_z_loss N=" + std::to_string(cs.n) + " E=" + std::to_string(cs.e);
    check_scalar(gpu().moe_z_loss(logits.g, grad_scale, Tensor()), cpu().moe_z_loss(logits.c, grad_scale, Tensor()),
                 1e-5, what + " loss only");
    // dlogits accumulates: both start from the same non-zero values.
    Pair dl = random_pair({cs.n, cs.e}, DType::kF32, ++seed, 0.1f * grad_scale);
    Tensor dl_start = gpu_clone(dl.g);
    const double lc = cpu().moe_z_loss(logits.c, grad_scale, dl.c);
    const double lg = gpu().moe_z_loss(logits.g, grad_scale, dl.g);
    check_scalar(lg, lc, 1e-5, what + " loss");
    expect_close(dl, DType::kF32, what + " dlogits");
    const double again = gpu().moe_z_loss(logits.g, grad_scale, dl_start);
    BOOST_CHECK_MESSAGE(again == lg && same_bytes(dl_start, dl.g), what << ": not bitwise reproducible");
  }
}

// ---- sequence-wise balance loss ----

namespace {
struct AuxCase {
  int64_t n, e, s;
};
// One chunk, exactly one chunk, one row past it, and many chunks; samples interleaved.
const AuxCase kAuxCases[] = {{37, 8, 1}, {256, 16, 2}, {257, 16, 2}, {300, 64, 3}, {1000, 256, 4}, {5000, 128, 8}};
}  // namespace

BOOST_AUTO_TEST_CASE(moe_aux_stats_matches_cpu_and_is_deterministic) {
  uint64_t seed = 600;
  for (const AuxCase& cs : kAuxCases)
    for (MoeScoreFunc f : kScoreFuncs) {
      Pair scores = router_scores(cs.n, cs.e, f, ++seed);
      Pair sample = int_pair({cs.n}, random_ints(cs.n, 0, int(cs.s), ++seed));
      Pair sums = output_pair({cs.s, cs.e}, DType::kF32);
      const std::string what = std::string("moe_aux_stats ") + func_name(f) + " N=" + std::to_string(cs.n) +
                               " E=" + std::to_string(cs.e) + " S=" + std::to_string(cs.s);
      cpu().moe_aux_stats(scores.c, sample.c, f, sums.c);
      gpu().moe_aux_stats(scores.g, sample.g, f, sums.g);
      expect_close(sums, DType::kF32, what);
      Tensor again = gpu().empty({cs.s, cs.e}, DType::kF32, kTmp);
      gpu().moe_aux_stats(scores.g, sample.g, f, again);
      BOOST_CHECK_MESSAGE(same_bytes(again, sums.g), what << ": not bitwise reproducible");
    }
}

BOOST_AUTO_TEST_CASE(moe_aux_backward_matches_cpu) {
  uint64_t seed = 700;
  for (const AuxCase& cs : kAuxCases)
    for (MoeScoreFunc f : kScoreFuncs) {
      Pair scores = router_scores(cs.n, cs.e, f, ++seed);
      Pair sample = int_pair({cs.n}, random_ints(cs.n, 0, int(cs.s), ++seed));
      Pair coef = random_pair({cs.s, cs.e}, DType::kF32, ++seed);
      Pair ds = output_pair({cs.n, cs.e}, DType::kF32);
      cpu().moe_aux_backward(coef.c, sample.c, scores.c, f, ds.c);
      gpu().moe_aux_backward(coef.g, sample.g, scores.g, f, ds.g);
      expect_close(ds, DType::kF32,
                   std::string("moe_aux_backward ") + func_name(f) + " N=" + std::to_string(cs.n) +
                       " E=" + std::to_string(cs.e) + " S=" + std::to_string(cs.s));
    }
}

// ---- dispatch and combine ----

BOOST_AUTO_TEST_CASE(gather_rows_matches_cpu) {
  struct Case {
    int64_t n, d, r, off;  // off = 1: misaligned views (scalar path)
  };
  uint64_t seed = 800;
  for (const Case& cs : {Case{37, 200, 80, 0}, Case{300, 64, 300, 0}, Case{64, 37, 10, 0}, Case{16, 2048, 100, 0},
                         Case{50, 64, 120, 1}})
    for (DType dt : kDtypes) {
      Pair src_all = random_pair({cs.n * cs.d + cs.off}, dt, ++seed);
      Pair src{src_all.c.view({cs.n, cs.d}, cs.off), src_all.g.view({cs.n, cs.d}, cs.off)};
      Pair index = int_pair({cs.r}, random_ints(cs.r, 0, int(cs.n), ++seed));
      Pair dst_all = output_pair({cs.r * cs.d + cs.off}, dt);
      Pair dst{dst_all.c.view({cs.r, cs.d}, cs.off), dst_all.g.view({cs.r, cs.d}, cs.off)};
      cpu().gather_rows(src.c, index.c, dst.c);
      gpu().gather_rows(src.g, index.g, dst.g);
      expect_close(dst, dt, "gather_rows " + shape_str(dst.c.shape()) + (cs.off ? " misaligned" : ""), 1e-30);
    }
}

BOOST_AUTO_TEST_CASE(bad_indices_give_nan_rows_on_the_gpu) {
  // The CPU throws; the GPU cannot check without a synchronization and poisons the rows instead.
  const int64_t n = 6, d = 16;
  Pair src = random_pair({n, d}, DType::kF32, 1);
  Pair index = int_pair({4}, {0, -1, int32_t(n), 5});
  Pair dst = output_pair({4, d}, DType::kF32);
  BOOST_CHECK_THROW(cpu().gather_rows(src.c, index.c, dst.c), std::out_of_range);
  gpu().gather_rows(src.g, index.g, dst.g);
  const std::vector<float> got = host_values(gpu(), dst.g), want = host_values(cpu(), src.c);
  for (int64_t c = 0; c < d; ++c) {
    BOOST_CHECK_EQUAL(got[size_t(c)], want[size_t(c)]);
    BOOST_CHECK(std::isnan(got[size_t(d + c)]) && std::isnan(got[size_t(2 * d + c)]));
    BOOST_CHECK_EQUAL(got[size_t(3 * d + c)], want[size_t(5 * d + c)]);
  }
  Pair rows = int_pair({2, 2}, {0, 1, 2, 9});
  Pair out = output_pair({2, d}, DType::kF32);
  gpu().moe_combine(src.g, rows.g, Tensor(), out.g);
  const std::vector<float> o = host_values(gpu(), out.g);
  for (int64_t c = 0; c < d; ++c) {
    BOOST_CHECK(std::isfinite(o[size_t(c)]));
    BOOST_CHECK(std::isnan(o[size_t(d + c)]));
  }
}

namespace {
struct CombineCase {
  int64_t n, k, d, off;  // off = 1: misaligned views (scalar path)
};
const CombineCase kCombineCases[] = {{37, 2, 200, 0}, {300, 8, 64, 0}, {64, 6, 37, 0},
                                     {16, 4, 2048, 0}, {5, 1, 8, 0},   {40, 3, 64, 1}};

/// A pair of views `off` elements into a random (or poisoned output) buffer.
Pair offset_view(const Shape& s, DType dt, int64_t off, uint64_t seed, bool output) {
  const int64_t n = shape_numel(s);
  Pair all = output ? output_pair({n + off}, dt) : random_pair({n + off}, dt, seed);
  return {all.c.view(s, off), all.g.view(s, off)};
}
}  // namespace

BOOST_AUTO_TEST_CASE(moe_combine_matches_cpu) {
  uint64_t seed = 900;
  for (const CombineCase& cs : kCombineCases)
    for (DType dt : kDtypes)
      for (bool with_gates : {true, false})
        for (bool permuted : {true, false}) {  // permuted: every expert row once; else repeats
          const int64_t r = cs.n * cs.k;
          Pair y = offset_view({r, cs.d}, dt, cs.off, ++seed, false);
          Pair rows = int_pair({cs.n, cs.k}, permuted ? permutation(r, ++seed) : random_ints(r, 0, int(r), ++seed));
          Pair gates = random_pair({cs.n, cs.k}, DType::kF32, ++seed, 0.5f);
          Pair out = offset_view({cs.n, cs.d}, dt, cs.off, 0, true);
          cpu().moe_combine(y.c, rows.c, with_gates ? gates.c : Tensor(), out.c);
          gpu().moe_combine(y.g, rows.g, with_gates ? gates.g : Tensor(), out.g);
          expect_close(out, dt,
                       "moe_combine N=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k) +
                           " D=" + std::to_string(cs.d) + (with_gates ? " gates" : " ones") +
                           (permuted ? "" : " repeated rows") + (cs.off ? " misaligned" : ""));
        }
}

BOOST_AUTO_TEST_CASE(moe_combine_backward_matches_cpu_and_is_deterministic) {
  uint64_t seed = 1000;
  for (const CombineCase& cs : kCombineCases)
    for (DType dt : kDtypes) {
      const int64_t r = cs.n * cs.k;
      const std::string what = "moe_combine_backward N=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k) +
                               " D=" + std::to_string(cs.d) + (cs.off ? " misaligned" : "");
      Pair dout = offset_view({cs.n, cs.d}, dt, cs.off, ++seed, false);
      Pair y = offset_view({r, cs.d}, dt, cs.off, ++seed, false);
      Pair rows = int_pair({cs.n, cs.k}, permutation(r, ++seed));
      Pair gates = random_pair({cs.n, cs.k}, DType::kF32, ++seed, 0.5f);
      Pair dy = offset_view({r, cs.d}, dt, cs.off, 0, true);
      Pair dgates = output_pair({cs.n, cs.k}, DType::kF32);
      cpu().moe_combine_backward(dout.c, y.c, rows.c, gates.c, dy.c, dgates.c);
      gpu().moe_combine_backward(dout.g, y.g, rows.g, gates.g, dy.g, dgates.g);
      expect_close(dy, dt, what + " dy");
      // Products of bf16 inputs are exact in f32: only the summation order differs.
      expect_close(dgates, DType::kF32, what + " dgates", dt == DType::kBF16 ? 1e-4 : 1e-5);
      Tensor dy2 = gpu().empty({r, cs.d}, dt, kTmp), dg2 = gpu().empty({cs.n, cs.k}, DType::kF32, kTmp);
      gpu().moe_combine_backward(dout.g, y.g, rows.g, gates.g, dy2, dg2);
      BOOST_CHECK_MESSAGE(same_bytes(dg2, dgates.g), what << ": dgates not bitwise reproducible");
    }
}

// ---- grouped GEMM (Device's default: one cuBLASLt matmul per group on views) ----

BOOST_AUTO_TEST_CASE(grouped_matmul_matches_cpu) {
  struct Case {
    int64_t p, q;
    std::vector<int64_t> counts;
  };
  uint64_t seed = 1100;
  // Empty groups first, in the middle and last; odd P and Q put the group views at offsets
  // that are not 16-byte aligned.
  for (const Case& cs : {Case{48, 40, {5, 0, 17, 1, 9}}, Case{37, 29, {0, 3, 7, 0}}, Case{64, 128, {33}}})
    for (DType dt : kDtypes) {
      const int64_t g = int64_t(cs.counts.size());
      int64_t r = 0;
      for (int64_t c : cs.counts) r += c;
      const std::string what = "grouped_matmul P=" + std::to_string(cs.p) + " Q=" + std::to_string(cs.q) +
                               " G=" + std::to_string(g) + " R=" + std::to_string(r);
      Pair w = random_pair({g, cs.p, cs.q}, dt, ++seed, 0.1f);
      {
        Pair a = random_pair({r, cs.q}, dt, ++seed), c = output_pair({r, cs.p}, dt);
        cpu().grouped_matmul(GroupedGemm::kForward, a.c, Tensor(), w.c, c.c, cs.counts);
        gpu().grouped_matmul(GroupedGemm::kForward, a.g, Tensor(), w.g, c.g, cs.counts);
        // A row of no group stays unwritten on both; here every row belongs to one.
        expect_close(c, dt, what + " forward");
      }
      {
        Pair a = random_pair({r, cs.p}, dt, ++seed), c = output_pair({r, cs.q}, dt);
        cpu().grouped_matmul(GroupedGemm::kBackwardInput, a.c, Tensor(), w.c, c.c, cs.counts);
        gpu().grouped_matmul(GroupedGemm::kBackwardInput, a.g, Tensor(), w.g, c.g, cs.counts);
        expect_close(c, dt, what + " backward input");
      }
      {
        Pair a = random_pair({r, cs.p}, dt, ++seed), b = random_pair({r, cs.q}, dt, ++seed);
        Pair dw = random_pair({g, cs.p, cs.q}, DType::kF32, ++seed);  // accumulates (f32, as gradients)
        cpu().grouped_matmul(GroupedGemm::kBackwardWeight, a.c, b.c, dw.c, Tensor(), cs.counts);
        gpu().grouped_matmul(GroupedGemm::kBackwardWeight, a.g, b.g, dw.g, Tensor(), cs.counts);
        expect_close(dw, dt, what + " backward weight");
      }
    }
}

// ---- argument checks ----

BOOST_AUTO_TEST_CASE(moe_kernels_reject_bad_arguments) {
  auto f32 = [](const Shape& s) { return gpu().empty(s, DType::kF32, kTmp); };
  auto i32 = [](const Shape& s) { return gpu().empty(s, DType::kI32, kTmp); };
  auto b16 = [](const Shape& s) { return gpu().empty(s, DType::kBF16, kTmp); };
  const int64_t n = 8, e = 16, k = 2, d = 32;
  const MoeRouting r{MoeScoreFunc::kSoftmax, k, false, 1.0f};
  const MoeRouting k0{MoeScoreFunc::kSoftmax, 0, false, 1.0f}, k17{MoeScoreFunc::kSoftmax, e + 1, false, 1.0f};
  BOOST_CHECK_THROW(gpu().moe_router_forward(f32({n, e}), Tensor(), k0, true, f32({n, e}), i32({n, 1}), f32({n, 1})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(
      gpu().moe_router_forward(f32({n, e}), Tensor(), k17, true, f32({n, e}), i32({n, e + 1}), f32({n, e + 1})),
      std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_router_forward(f32({n, e}), Tensor(), r, true, f32({n, e + 1}), i32({n, k}), f32({n, k})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_router_forward(f32({n, e}), f32({e - 1}), r, true, f32({n, e}), i32({n, k}), f32({n, k})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_router_forward(f32({n, e}), Tensor(), r, true, f32({n, e}), f32({n, k}), f32({n, k})),
                    std::invalid_argument);  // topk must be i32
  BOOST_CHECK_THROW(gpu().moe_router_forward(b16({n, e}), Tensor(), r, true, f32({n, e}), i32({n, k}), f32({n, k})),
                    std::invalid_argument);  // router logits are f32
  BOOST_CHECK_THROW(gpu().moe_router_backward(f32({n, k + 1}), f32({n, e}), i32({n, k}), r, Tensor(), f32({n, e})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_router_backward(f32({n, k}), f32({n, e}), i32({n, k}), r, f32({n, e - 1}), f32({n, e})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_z_loss(f32({n, e}), 1.0f, f32({n + 1, e})), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_aux_stats(f32({n, e}), i32({n - 1}), MoeScoreFunc::kSoftmax, f32({2, e})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_aux_stats(f32({n, e}), i32({n}), MoeScoreFunc::kSoftmax, f32({2, e + 1})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_aux_backward(f32({2, e + 1}), i32({n}), f32({n, e}), MoeScoreFunc::kSigmoid, f32({n, e})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().gather_rows(f32({n, d}), i32({4}), b16({4, d})), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().gather_rows(f32({n, d}), i32({4}), f32({5, d})), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_combine(f32({n * k, d}), i32({n, k}), f32({n, k + 1}), f32({n, d})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_combine(f32({n * k, d}), i32({n, k}), Tensor(), b16({n, d})), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_combine_backward(f32({n, d}), f32({n * k, d}), i32({n, k}), f32({n, k}),
                                               f32({n * k + 1, d}), f32({n, k})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().moe_combine_backward(f32({n, d}), f32({n * k, d}), i32({n, k}), Tensor(), f32({n * k, d}),
                                               f32({n, k})),
                    std::invalid_argument);  // gates are required here
}

int main(int argc, char** argv) { return meshtrain::gputest::gpu_test_main(argc, argv); }
