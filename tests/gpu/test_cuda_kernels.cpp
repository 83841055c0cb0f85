// CudaDevice kernels against the CpuDevice reference (gpu_test_util.hpp): embedding, RMSNorm
// (plain, fused residual add, fused residual gradient), RoPE, SwiGLU, cross-entropy (full and
// vocab-parallel), AdamW, reductions and the flat ops, in f32 (≤ 1e-5 normwise) and bf16
// (inputs rounded to bf16 for both devices, ≤ 1e-2). Shapes include rows that are not a
// multiple of the vector width and misaligned views, so the scalar fallbacks run too; outputs
// are poisoned with NaN first, and accumulating outputs start from equal non-zero values.
#include "gpu_test_util.hpp"

#include <cfloat>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/bf16.hpp"

using namespace meshtrain;
using namespace meshtrain::gputest;

namespace {

const DType kDtypes[] = {DType::kF32, DType::kBF16};
constexpr MemCategory kTmp = MemCategory::kTemporaries;

std::string label(const std::string& what, const Shape& s) { return what + " " + shape_str(s); }

/// A random pair viewed `off` elements into a slightly larger buffer: off = 1 makes the GPU
/// pointer misaligned for 16-byte vectors, so the scalar paths run.
Pair offset_pair(const Shape& s, DType dt, uint64_t seed, int64_t off, float std = 1.0f) {
  const int64_t n = shape_numel(s);
  Pair base = random_pair({n + off}, dt, seed, std);
  return {base.c.view(s, off), base.g.view(s, off)};
}

/// Copies the values of a CPU tensor into a new GPU tensor of dtype dt.
Tensor to_gpu(const Tensor& c, DType dt) {
  Tensor g = gpu().empty(c.shape(), dt, kTmp);
  set_values(gpu(), g, host_values(cpu(), c));
  return g;
}

double rel_diff(double g, double c) { return std::fabs(g - c) / std::max(std::fabs(c), 1e-300); }

void check_scalar(double g, double c, double tolerance, const std::string& what) {
  BOOST_TEST_MESSAGE(what << ": gpu " << g << " cpu " << c << " rel " << rel_diff(g, c));
  BOOST_CHECK_MESSAGE(rel_diff(g, c) <= tolerance, what << ": gpu " << g << " vs cpu " << c);
}

void upload_ids(const Pair& p, const std::vector<int32_t>& ids) {
  cpu().upload(p.c, ids.data(), ids.size() * 4);
  gpu().upload(p.g, ids.data(), ids.size() * 4);
}

}  // namespace

// ---- embedding ----

BOOST_AUTO_TEST_CASE(embedding_forward_matches_cpu) {
  struct Case {
    int64_t n, v_local, d, vocab_start, vocab_size;
  };
  uint64_t seed = 100;
  for (const Case& cs : {Case{37, 50, 200, 0, 50}, Case{256, 1000, 2048, 0, 1000}, Case{64, 40, 37, 100, 300},
                         Case{300, 128, 64, 64, 256}})
    for (DType dt : kDtypes) {
      Pair w = random_pair({cs.v_local, cs.d}, dt, ++seed);
      Pair tok = id_pair(cs.n, 0, int(cs.vocab_size), ++seed);
      Pair out = output_pair({cs.n, cs.d}, dt);
      cpu().embedding_forward(w.c, tok.c, out.c, cs.vocab_start, cs.vocab_size);
      gpu().embedding_forward(w.g, tok.g, out.g, cs.vocab_start, cs.vocab_size);
      expect_close(out, dt, label("embedding_forward", out.c.shape()), 1e-30);  // a copy: exact
    }
}

BOOST_AUTO_TEST_CASE(embedding_forward_bad_token_throws_out_of_range) {
  const int64_t n = 16, v = 300, d = 64;
  for (int bad : {int(v), -1, -7}) {
    Pair w = random_pair({v, d}, DType::kF32, 7);
    Pair tok = id_pair(n, 0, int(v), 8);
    std::vector<int32_t> ids(size_t(n), 5);
    ids[7] = bad;
    upload_ids(tok, ids);
    Pair out = output_pair({n, d}, DType::kF32);
    BOOST_CHECK_THROW(cpu().embedding_forward(w.c, tok.c, out.c, 0, v), std::out_of_range);
    gpu().embedding_forward(w.g, tok.g, out.g, 0, v);  // asynchronous: flagged on the device
    BOOST_CHECK_THROW(gpu().synchronize(), std::out_of_range);
    BOOST_CHECK_NO_THROW(gpu().synchronize());  // the flag was consumed
  }
}

BOOST_AUTO_TEST_CASE(embedding_backward_matches_cpu_and_is_deterministic) {
  struct Case {
    int64_t n, v_local, d, vocab_start, id_hi;
  };
  uint64_t seed = 200;
  // Few distinct ids per shard, so rows repeat many times; ids outside the shard are skipped.
  for (const Case& cs : {Case{300, 50, 200, 10, 80}, Case{37, 64, 64, 0, 64}, Case{512, 100, 2048, 0, 100},
                         Case{129, 20, 37, 5, 40}})
    for (DType dt : kDtypes) {
      Pair g = random_pair({cs.n, cs.d}, dt, ++seed);
      Pair tok = id_pair(cs.n, 0, int(cs.id_hi), ++seed);
      Pair gw = random_pair({cs.v_local, cs.d}, DType::kF32, ++seed);  // accumulates into existing values
      Tensor start = gpu_clone(gw.g);
      cpu().embedding_backward(g.c, tok.c, gw.c, cs.vocab_start);
      gpu().embedding_backward(g.g, tok.g, gw.g, cs.vocab_start);
      expect_close(gw, dt, label("embedding_backward", g.c.shape()));
      gpu().embedding_backward(g.g, tok.g, start, cs.vocab_start);
      BOOST_CHECK_MESSAGE(same_bytes(start, gw.g), "embedding_backward is not bitwise reproducible");
    }
}

BOOST_AUTO_TEST_CASE(embedding_backward_of_a_heavily_repeated_token_matches_cpu) {
  // A frequent token is one long run of sorted positions, cut into chunk pieces summed by
  // several blocks and added up in chunk order (embedding.cu). Runs across many chunks, runs
  // ending exactly at a chunk boundary, a whole batch of one token, and the scalar path.
  struct Case {
    int64_t n, d;
    double share;  // fraction of positions holding token 3
  };
  uint64_t seed = 700;
  for (const Case& cs : {Case{40000, 512, 0.8}, Case{20000, 256, 1.0}, Case{1024, 128, 1.0}, Case{4096, 37, 0.5},
                         Case{129, 64, 1.0}})
    for (DType dt : kDtypes) {
      const int64_t v = 64;
      Pair g = random_pair({cs.n, cs.d}, dt, ++seed);
      Pair tok = id_pair(cs.n, 0, int(v), ++seed);
      std::mt19937_64 rng(++seed);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      std::uniform_int_distribution<int32_t> other(0, int32_t(v) - 1);
      std::vector<int32_t> ids(static_cast<size_t>(cs.n));
      for (auto& id : ids) id = u(rng) < cs.share ? 3 : other(rng);
      upload_ids(tok, ids);
      Pair gw = random_pair({v, cs.d}, DType::kF32, ++seed);
      Tensor start = gpu_clone(gw.g);
      cpu().embedding_backward(g.c, tok.c, gw.c, 0);
      gpu().embedding_backward(g.g, tok.g, gw.g, 0);
      expect_close(gw, dt, label("embedding_backward, repeated token", g.c.shape()));
      gpu().embedding_backward(g.g, tok.g, start, 0);
      BOOST_CHECK_MESSAGE(same_bytes(start, gw.g), "embedding_backward is not bitwise reproducible");
    }
}

// ---- RMSNorm ----

namespace {
// Row lengths covering the register paths (ITEMS 1..8, several rows per block), the scalar
// fallback (D not a multiple of the vector) and the streaming kernels (D > 8192 elements).
const Shape kNormShapes[] = {{37, 200}, {4, 64, 2048}, {300, 128}, {16, 96},   {5, 1001},
                             {3, 8192}, {2, 40000},    {4, 3001},  {64, 37}};
constexpr float kEps = 1e-5f;
}  // namespace

BOOST_AUTO_TEST_CASE(rmsnorm_forward_matches_cpu) {
  uint64_t seed = 300;
  for (const Shape& s : kNormShapes)
    for (DType dt : kDtypes) {
      const int64_t d = s.back(), n = shape_numel(s) / d;
      Pair x = random_pair(s, dt, ++seed), w = random_pair({d}, dt, ++seed);
      Pair y = output_pair(s, dt), rstd = output_pair({n}, DType::kF32);
      cpu().rmsnorm_forward(x.c, w.c, kEps, y.c, rstd.c);
      gpu().rmsnorm_forward(x.g, w.g, kEps, y.g, rstd.g);
      expect_close(y, dt, label("rmsnorm_forward y", s));
      expect_close(rstd, dt, label("rmsnorm_forward rstd", s));
    }
}

BOOST_AUTO_TEST_CASE(rmsnorm_forward_misaligned_views) {
  for (DType dt : kDtypes) {
    const Shape s{37, 200};
    Pair x = offset_pair(s, dt, 1, 1), w = offset_pair({200}, dt, 2, 1);
    Pair y = offset_pair(s, dt, 3, 1), rstd = output_pair({37}, DType::kF32);
    poison(y.g);
    cpu().rmsnorm_forward(x.c, w.c, kEps, y.c, rstd.c);
    gpu().rmsnorm_forward(x.g, w.g, kEps, y.g, rstd.g);
    expect_close(y, dt, "rmsnorm_forward misaligned y");
    expect_close(rstd, dt, "rmsnorm_forward misaligned rstd");
  }
}

BOOST_AUTO_TEST_CASE(add_rmsnorm_forward_matches_cpu) {
  uint64_t seed = 400;
  for (const Shape& s : kNormShapes)
    for (DType dt : kDtypes) {
      const int64_t d = s.back(), n = shape_numel(s) / d;
      Pair h = random_pair(s, dt, ++seed), delta = random_pair(s, dt, ++seed), w = random_pair({d}, dt, ++seed);
      Pair y = output_pair(s, dt), rstd = output_pair({n}, DType::kF32);
      cpu().add_rmsnorm_forward(h.c, delta.c, w.c, kEps, y.c, rstd.c);
      gpu().add_rmsnorm_forward(h.g, delta.g, w.g, kEps, y.g, rstd.g);
      expect_close(h, dt, label("add_rmsnorm_forward h", s));
      expect_close(y, dt, label("add_rmsnorm_forward y", s));
      expect_close(rstd, dt, label("add_rmsnorm_forward rstd", s));
    }
}

BOOST_AUTO_TEST_CASE(rmsnorm_backward_matches_cpu_and_is_deterministic) {
  uint64_t seed = 500;
  for (const Shape& s : kNormShapes)
    for (DType dt : kDtypes) {
      const int64_t d = s.back(), n = shape_numel(s) / d;
      Pair x = random_pair(s, dt, ++seed), w = random_pair({d}, dt, ++seed), dy = random_pair(s, dt, ++seed);
      // rstd as the forward saves it, identical on both devices.
      Tensor y = cpu().empty(s, DType::kF32, kTmp), rstd_c = cpu().empty({n}, DType::kF32, kTmp);
      cpu().rmsnorm_forward(x.c, w.c, kEps, y, rstd_c);
      Tensor rstd_g = to_gpu(rstd_c, DType::kF32);
      Pair dx = output_pair(s, dt);
      Pair dw = random_pair({d}, DType::kF32, ++seed);
      Tensor dw_start = gpu_clone(dw.g);
      cpu().rmsnorm_backward(dy.c, x.c, w.c, rstd_c, dx.c, dw.c);
      gpu().rmsnorm_backward(dy.g, x.g, w.g, rstd_g, dx.g, dw.g);
      expect_close(dx, dt, label("rmsnorm_backward dx", s));
      expect_close(dw, dt, label("rmsnorm_backward dw", s));
      Tensor dx2 = gpu().empty(s, dt, kTmp);
      gpu().rmsnorm_backward(dy.g, x.g, w.g, rstd_g, dx2, dw_start);
      BOOST_CHECK_MESSAGE(same_bytes(dw_start, dw.g) && same_bytes(dx2, dx.g),
                          "rmsnorm_backward is not bitwise reproducible " << shape_str(s));
    }
}

BOOST_AUTO_TEST_CASE(rmsnorm_backward_residual_matches_cpu) {
  uint64_t seed = 600;
  for (const Shape& s : kNormShapes)
    for (DType dt : kDtypes)
      for (bool alias : {false, true}) {
        const int64_t d = s.back(), n = shape_numel(s) / d;
        Pair x = random_pair(s, dt, ++seed), w = random_pair({d}, dt, ++seed), dy = random_pair(s, dt, ++seed);
        Pair res = random_pair(s, dt, ++seed);
        Tensor y = cpu().empty(s, DType::kF32, kTmp), rstd_c = cpu().empty({n}, DType::kF32, kTmp);
        cpu().rmsnorm_forward(x.c, w.c, kEps, y, rstd_c);
        Tensor rstd_g = to_gpu(rstd_c, DType::kF32);
        Pair dx = alias ? res : output_pair(s, dt);  // alias: dx overwrites residual in place
        Pair dw = random_pair({d}, DType::kF32, ++seed);
        cpu().rmsnorm_backward_residual(dy.c, x.c, w.c, rstd_c, res.c, dx.c, dw.c);
        gpu().rmsnorm_backward_residual(dy.g, x.g, w.g, rstd_g, res.g, dx.g, dw.g);
        const std::string what = label(alias ? "rmsnorm_backward_residual (dx aliases residual)"
                                              : "rmsnorm_backward_residual",
                                       s);
        expect_close(dx, dt, what + " dx");
        expect_close(dw, dt, what + " dw");
      }
}

BOOST_AUTO_TEST_CASE(rmsnorm_rejects_mixed_dtypes_and_shapes) {
  Tensor x = gpu().empty({4, 64}, DType::kBF16, kTmp), y = gpu().empty({4, 64}, DType::kBF16, kTmp);
  Tensor w32 = gpu().empty({64}, DType::kF32, kTmp), w16 = gpu().empty({64}, DType::kBF16, kTmp);
  Tensor rstd = gpu().empty({4}, DType::kF32, kTmp), rstd_bad = gpu().empty({5}, DType::kF32, kTmp);
  BOOST_CHECK_THROW(gpu().rmsnorm_forward(x, w32, kEps, y, rstd), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().rmsnorm_forward(x, w16, kEps, y, rstd_bad), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().rmsnorm_backward(y, x, w16, rstd, x, w16), std::invalid_argument);  // dw must be f32
}

// ---- RoPE ----

BOOST_AUTO_TEST_CASE(rope_matches_cpu) {
  uint64_t seed = 700;
  for (const Shape& s : {Shape{2, 37, 3, 64}, Shape{1, 16, 4, 6}, Shape{2, 128, 8, 128}, Shape{3, 5, 2, 10}})
    for (DType dt : kDtypes) {
      const int64_t t = s[1], half = s[3] / 2, t_table = t + 3;  // tables may be longer than T
      std::vector<float> cs(size_t(t_table * half)), sn(cs.size());
      for (int64_t ti = 0; ti < t_table; ++ti)
        for (int64_t j = 0; j < half; ++j) {
          const double theta = double(ti) * std::pow(10000.0, -2.0 * double(j) / double(s[3]));
          cs[size_t(ti * half + j)] = float(std::cos(theta));
          sn[size_t(ti * half + j)] = float(std::sin(theta));
        }
      Pair cos_t = make_pair({t_table, half}, DType::kF32, cs), sin_t = make_pair({t_table, half}, DType::kF32, sn);
      Pair x = random_pair(s, dt, ++seed);
      for (bool inverse : {false, true}) {
        cpu().rope(x.c, cos_t.c, sin_t.c, inverse);
        gpu().rope(x.g, cos_t.g, sin_t.g, inverse);
        expect_close(x, dt, label(inverse ? "rope inverse" : "rope", s));
      }
    }
}

// ---- SwiGLU ----

BOOST_AUTO_TEST_CASE(swiglu_matches_cpu) {
  uint64_t seed = 800;
  for (const Shape& s : {Shape{37, 200}, Shape{64, 5632}, Shape{7, 13}})
    for (DType dt : kDtypes)
      for (int64_t off : {0, 1}) {
        Pair a = offset_pair(s, dt, ++seed, off), b = offset_pair(s, dt, ++seed, off);
        Pair dy = offset_pair(s, dt, ++seed, off);
        Pair y = output_pair(s, dt), da = output_pair(s, dt), db = output_pair(s, dt);
        cpu().swiglu_forward(a.c, b.c, y.c);
        gpu().swiglu_forward(a.g, b.g, y.g);
        const std::string what = label(off ? "swiglu (misaligned)" : "swiglu", s);
        expect_close(y, dt, what + " forward");
        cpu().swiglu_backward(dy.c, a.c, b.c, da.c, db.c);
        gpu().swiglu_backward(dy.g, a.g, b.g, da.g, db.g);
        expect_close(da, dt, what + " da");
        expect_close(db, dt, what + " db");
      }
}

// ---- cross-entropy ----

BOOST_AUTO_TEST_CASE(cross_entropy_matches_cpu) {
  uint64_t seed = 900;
  for (const Shape& s : {Shape{37, 1001}, Shape{64, 32000}, Shape{8, 128256}, Shape{5, 37}})
    for (DType dt : kDtypes) {
      const int64_t n = s[0], v = s[1];
      const float grad_scale = 1.0f / float(n);
      Pair logits = random_pair(s, dt, ++seed, 3.0f);
      Pair tgt = id_pair(n, 0, int(v), ++seed);
      // Loss only.
      check_scalar(gpu().cross_entropy(logits.g, tgt.g, Tensor(), grad_scale),
                   cpu().cross_entropy(logits.c, tgt.c, Tensor(), grad_scale), tol(dt),
                   label(std::string("cross_entropy loss-only [") + dtype_name(dt) + "]", s));
      // Loss and gradient into a separate tensor.
      Pair dl = output_pair(s, dt);
      const double lc = cpu().cross_entropy(logits.c, tgt.c, dl.c, grad_scale);
      const double lg = gpu().cross_entropy(logits.g, tgt.g, dl.g, grad_scale);
      check_scalar(lg, lc, tol(dt), label(std::string("cross_entropy loss [") + dtype_name(dt) + "]", s));
      expect_close(dl, dt, label("cross_entropy dlogits", s));
      // Gradient written over the logits (dlogits aliases logits on both devices).
      const double ac = cpu().cross_entropy(logits.c, tgt.c, logits.c, grad_scale);
      const double ag = gpu().cross_entropy(logits.g, tgt.g, logits.g, grad_scale);
      check_scalar(ag, ac, tol(dt), label(std::string("cross_entropy aliased loss [") + dtype_name(dt) + "]", s));
      expect_close(logits, dt, label("cross_entropy dlogits aliasing logits", s));
    }
}

BOOST_AUTO_TEST_CASE(cross_entropy_bad_target_throws_out_of_range) {
  const int64_t n = 9, v = 100;
  for (int bad : {int(v), -1, 1000}) {
    Pair logits = random_pair({n, v}, DType::kF32, 11);
    Pair tgt = id_pair(n, 0, int(v), 12);
    std::vector<int32_t> ids(size_t(n), 3);
    ids[4] = bad;
    upload_ids(tgt, ids);
    Pair dl = output_pair({n, v}, DType::kF32);
    BOOST_CHECK_THROW(cpu().cross_entropy(logits.c, tgt.c, dl.c, 1.0f), std::out_of_range);
    BOOST_CHECK_THROW(gpu().cross_entropy(logits.g, tgt.g, dl.g, 1.0f), std::out_of_range);
  }
  // The flag was consumed: a valid call afterwards succeeds.
  Pair logits = random_pair({n, v}, DType::kF32, 13);
  Pair tgt = id_pair(n, 0, int(v), 14);
  BOOST_CHECK_NO_THROW(gpu().cross_entropy(logits.g, tgt.g, Tensor(), 1.0f));
}

BOOST_AUTO_TEST_CASE(vocab_parallel_cross_entropy_matches_cpu) {
  struct Case {
    int64_t p, n, v_local;
  };
  uint64_t seed = 1000;
  for (const Case& cs : {Case{3, 37, 1000}, Case{2, 16, 37}, Case{4, 64, 8016}})
    for (DType dt : kDtypes) {
      const int64_t vocab = cs.p * cs.v_local;
      const float grad_scale = 0.5f / float(cs.n);
      Pair tgt = id_pair(cs.n, 0, int(vocab), ++seed);
      Pair stats_all = output_pair({cs.p, cs.n, 3}, DType::kF32);
      std::vector<Pair> logits;
      for (int64_t r = 0; r < cs.p; ++r) {
        logits.push_back(random_pair({cs.n, cs.v_local}, dt, ++seed, 3.0f));
        const Shape st{cs.n, 3};
        cpu().cross_entropy_partial(logits[r].c, tgt.c, r * cs.v_local, vocab, stats_all.c.view(st, r * cs.n * 3));
        gpu().cross_entropy_partial(logits[r].g, tgt.g, r * cs.v_local, vocab, stats_all.g.view(st, r * cs.n * 3));
      }
      const std::string what = "vocab-parallel P=" + std::to_string(cs.p) + " " + shape_str({cs.n, cs.v_local});
      expect_close(stats_all, dt, what + " stats");
      Pair lse = output_pair({cs.n}, DType::kF32);
      const double lc = cpu().cross_entropy_combine(stats_all.c, lse.c);
      const double lg = gpu().cross_entropy_combine(stats_all.g, lse.g);
      check_scalar(lg, lc, tol(dt), what + " combine loss [" + dtype_name(dt) + "]");
      expect_close(lse, dt, what + " lse");
      for (int64_t r = 0; r < cs.p; ++r) {
        const bool alias = r == 0;  // shard 0 writes its gradient over its logits
        Pair dl = alias ? logits[r] : output_pair({cs.n, cs.v_local}, dt);
        cpu().cross_entropy_grad(logits[r].c, tgt.c, r * cs.v_local, lse.c, dl.c, grad_scale, 0.01f);  // with PaLM's z-loss term
        gpu().cross_entropy_grad(logits[r].g, tgt.g, r * cs.v_local, lse.g, dl.g, grad_scale, 0.01f);
        expect_close(dl, dt, what + " grad shard " + std::to_string(r) + (alias ? " (aliasing logits)" : ""));
      }
    }
}

BOOST_AUTO_TEST_CASE(cross_entropy_partial_bad_target_throws_at_combine) {
  const int64_t n = 8, v = 50;
  Pair logits = random_pair({n, v}, DType::kF32, 21);
  Pair tgt = id_pair(n, 0, int(v), 22);
  std::vector<int32_t> ids(size_t(n), 1);
  ids[3] = int(2 * v);  // outside the vocabulary of 2 shards
  upload_ids(tgt, ids);
  Tensor stats_c = cpu().empty({1, n, 3}, DType::kF32, kTmp), stats_g = gpu().empty({1, n, 3}, DType::kF32, kTmp);
  Tensor lse_g = gpu().empty({n}, DType::kF32, kTmp);
  BOOST_CHECK_THROW(cpu().cross_entropy_partial(logits.c, tgt.c, 0, 2 * v, stats_c.view({n, 3})),
                    std::out_of_range);
  gpu().cross_entropy_partial(logits.g, tgt.g, 0, 2 * v, stats_g.view({n, 3}));
  BOOST_CHECK_THROW(gpu().cross_entropy_combine(stats_g, lse_g), std::out_of_range);
  BOOST_CHECK_NO_THROW(gpu().synchronize());
}

BOOST_AUTO_TEST_CASE(cross_entropy_rejects_bad_arguments) {
  Tensor logits = gpu().empty({4, 10}, DType::kBF16, kTmp), dl32 = gpu().empty({4, 10}, DType::kF32, kTmp);
  Tensor t32 = gpu().empty({4}, DType::kF32, kTmp), ti = gpu().empty({4}, DType::kI32, kTmp);
  gpu().fill(ti, 0.0f);
  BOOST_CHECK_THROW(gpu().cross_entropy(logits, t32, Tensor(), 1.0f), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().cross_entropy(logits, ti, dl32, 1.0f), std::invalid_argument);
}

// ---- optimizer and reductions ----

BOOST_AUTO_TEST_CASE(adamw_three_steps_match_cpu) {
  uint64_t seed = 1100;
  for (int64_t n : {int64_t(1000003), int64_t(4096), int64_t(37)})
    for (int64_t off : {0, 1}) {
      Pair w = offset_pair({n}, DType::kF32, ++seed, off), m = offset_pair({n}, DType::kF32, ++seed, off, 0.01f);
      std::vector<float> v0 = randn(n, ++seed, 1e-4f);
      for (float& x : v0) x = std::fabs(x);  // a second moment is non-negative
      Pair v = make_pair({n}, DType::kF32, v0);
      AdamWParams p;
      p.lr = 1e-3f, p.beta1 = 0.9f, p.beta2 = 0.95f, p.eps = 1e-8f, p.weight_decay = 0.1f;
      for (int64_t step = 1; step <= 3; ++step) {
        p.step = step;
        Pair g = offset_pair({n}, DType::kF32, ++seed, off, 0.01f);
        cpu().adamw(w.c, g.c, m.c, v.c, p);
        gpu().adamw(w.g, g.g, m.g, v.g, p);
      }
      const std::string what = "adamw n=" + std::to_string(n) + (off ? " misaligned" : "");
      expect_close(w, DType::kF32, what + " param");
      expect_close(m, DType::kF32, what + " exp_avg");
      expect_close(v, DType::kF32, what + " exp_avg_sq");
    }
  Tensor b = gpu().empty({8}, DType::kBF16, kTmp), f = gpu().empty({8}, DType::kF32, kTmp);
  BOOST_CHECK_THROW(gpu().adamw(b, f, f, f, AdamWParams{}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(sum_squares_matches_cpu_and_is_deterministic) {
  uint64_t seed = 1200;
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(4096), int64_t((1 << 20) + 3)})
    for (int64_t off : {0, 1}) {
      Pair x = offset_pair({n}, DType::kF32, ++seed, off);
      const double c = cpu().sum_squares(x.c), g = gpu().sum_squares(x.g);
      check_scalar(g, c, 1e-9, "sum_squares n=" + std::to_string(n) + (off ? " misaligned" : ""));
      BOOST_CHECK_EQUAL(gpu().sum_squares(x.g), g);  // bitwise repeatable
    }
}

BOOST_AUTO_TEST_CASE(scale_to_unit_norm_matches_cpu_and_the_synchronizing_path) {
  // The norm stays on the device (Muon's Newton–Schulz normalization): the CPU's result within
  // f32 rounding, and the bits of the GPU's own sum_squares + scale, which read it on the host.
  uint64_t seed = 1270;
  for (DType dt : kDtypes)
    for (int64_t n : {int64_t(1), int64_t(37), int64_t(4096), int64_t((1 << 20) + 3)})
      for (int64_t off : {0, 1}) {
        const std::string what = "scale_to_unit_norm n=" + std::to_string(n) + (off ? " misaligned" : "");
        Pair x = offset_pair({n}, dt, ++seed, off, 3.0f);
        const Tensor by_host = gpu_clone(x.g);
        gpu().scale(by_host, float(1.0 / (std::sqrt(gpu().sum_squares(by_host)) + 1e-7)));
        cpu().scale_to_unit_norm(x.c, 1e-7);
        gpu().scale_to_unit_norm(x.g, 1e-7);
        expect_close(x, dt, what);
        BOOST_CHECK_MESSAGE(same_bytes(x.g, by_host), what << " [" << dtype_name(dt) << "]: differs from sum_squares + scale");
      }
  Tensor i = gpu().empty({4}, DType::kI32, kTmp);
  BOOST_CHECK_THROW(gpu().scale_to_unit_norm(i, 1e-7), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(adamw_multi_matches_cpu_per_segment) {
  // 53 segments (three launches of at most 24), sizes from 1 to 300k, every fourth misaligned
  // (the scalar pass), weight decay alternating, two steps, the second with a gradient scale
  // (clipping's coefficient); CPU: adamw() per segment. Every third segment also has its bf16
  // compute copy written by the step (some of them 2-byte aligned only, which sends the segment
  // to the scalar pass): bitwise what cast() makes of the updated param.
  uint64_t seed = 1150;
  struct Seg {
    Pair w, g, m, v;
    float wd;
    Tensor compute;
  };
  std::vector<Seg> segs;
  for (int i = 0; i < 53; ++i) {
    const int64_t n = i == 0 ? 1 : (i * 5711) % 300007 + 3;
    const int64_t off = i % 4 == 3 ? 1 : 0;
    Seg s{offset_pair({n}, DType::kF32, ++seed, off), offset_pair({n}, DType::kF32, ++seed, off, 0.01f),
          offset_pair({n}, DType::kF32, ++seed, off, 0.01f), Pair{}, i % 2 ? 0.1f : 0.0f, Tensor()};
    std::vector<float> v0 = randn(n, ++seed, 1e-4f);
    for (float& x : v0) x = std::fabs(x);
    s.v = make_pair({n}, DType::kF32, v0);
    if (i % 3 == 0) {
      const int64_t coff = i % 6 == 3 ? 1 : 0;
      s.compute = gpu().empty({n + coff}, DType::kBF16, kTmp).view({n}, coff);
      poison(s.compute);
    }
    segs.push_back(std::move(s));
  }
  AdamWParams p;
  p.lr = 1e-3f, p.beta1 = 0.9f, p.beta2 = 0.95f, p.eps = 1e-8f;
  for (int64_t step = 1; step <= 2; ++step) {
    p.step = step;
    p.grad_scale = step == 1 ? 1.0f : 0.61f;
    std::vector<AdamWSegment> gpu_segs;
    for (Seg& s : segs) {
      AdamWParams q = p;
      q.weight_decay = s.wd;
      cpu().adamw(s.w.c, s.g.c, s.m.c, s.v.c, q);
      gpu_segs.push_back({s.w.g, s.g.g, s.m.g, s.v.g, s.wd, s.compute});
    }
    gpu().adamw_multi(gpu_segs, p);
  }
  for (size_t i = 0; i < segs.size(); ++i) {
    const std::string what = "adamw_multi segment " + std::to_string(i);
    expect_close(segs[i].w, DType::kF32, what + " param");
    expect_close(segs[i].m, DType::kF32, what + " exp_avg");
    expect_close(segs[i].v, DType::kF32, what + " exp_avg_sq");
    if (!segs[i].compute.defined()) continue;
    Tensor cast = gpu().empty({segs[i].w.g.numel()}, DType::kBF16, kTmp);
    gpu().cast(cast, segs[i].w.g);
    BOOST_CHECK_MESSAGE(same_bytes(segs[i].compute, cast), what << " compute copy differs from cast(param)");
  }
  // A compute copy must be bf16 of the param's numel.
  Seg& s0 = segs[1];
  const int64_t n1 = s0.w.g.numel();
  for (const Tensor& bad : {gpu().empty({n1}, DType::kF32, kTmp), gpu().empty({n1 + 1}, DType::kBF16, kTmp)})
    BOOST_CHECK_THROW(gpu().adamw_multi({AdamWSegment{s0.w.g, s0.g.g, s0.m.g, s0.v.g, 0.0f, bad}}, p),
                      std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(sum_squares_multi_matches_cpu) {
  uint64_t seed = 1250;
  std::vector<Pair> xs;
  std::vector<Tensor> c, g;
  std::vector<double> div;
  for (int i = 0; i < 41; ++i) {
    const int64_t n = (i * 7919) % 200003 + 1;
    xs.push_back(offset_pair({n}, DType::kF32, ++seed, i % 3 == 2 ? 1 : 0));
    c.push_back(xs.back().c);
    g.push_back(xs.back().g);
    div.push_back(i % 5 == 0 ? 2.0 : 1.0);
  }
  const double want = cpu().sum_squares_multi(c, div), got = gpu().sum_squares_multi(g, div);
  check_scalar(got, want, 1e-9, "sum_squares_multi");
  BOOST_CHECK_EQUAL(gpu().sum_squares_multi(g, div), got);  // bitwise repeatable
  BOOST_CHECK_THROW(gpu().sum_squares_multi(g, {1.0}), std::invalid_argument);
  // Per-tensor terms (the non-finite guard's parameter names) from the same pass.
  std::vector<double> each_c, each_g;
  cpu().sum_squares_multi(c, div, &each_c);
  BOOST_CHECK_EQUAL(gpu().sum_squares_multi(g, div, &each_g), got);
  BOOST_REQUIRE_EQUAL(each_g.size(), each_c.size());
  for (size_t i = 0; i < each_c.size(); ++i) check_scalar(each_g[i], each_c[i], 1e-9, "sum_squares_multi term");
  // A NaN in one tensor makes exactly its term (and the total) non-finite.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  gpu().upload(g[17], &nan, sizeof nan);
  BOOST_CHECK(std::isnan(gpu().sum_squares_multi(g, div, &each_g)));
  for (size_t i = 0; i < each_g.size(); ++i) BOOST_CHECK_EQUAL(std::isfinite(each_g[i]), i != 17);
}

// ---- flat ops ----

BOOST_AUTO_TEST_CASE(scale_add_copy_match_cpu) {
  uint64_t seed = 1300;
  for (const Shape& s : {Shape{37, 200}, Shape{1000003}, Shape{7}})
    for (DType dt : kDtypes)
      for (int64_t off : {0, 1}) {
        const std::string sfx = label(off ? " misaligned" : "", s);
        Pair x = offset_pair(s, dt, ++seed, off);
        cpu().scale(x.c, 0.37f);
        gpu().scale(x.g, 0.37f);
        expect_close(x, dt, "scale" + sfx);
        Pair y = offset_pair(s, dt, ++seed, off);
        cpu().add(y.c, x.c, -0.5f);
        gpu().add(y.g, x.g, -0.5f);
        expect_close(y, dt, "add" + sfx);
        Tensor dst = gpu().empty(s, dt, kTmp);
        poison(dst);
        gpu().copy(dst, y.g);
        BOOST_CHECK_MESSAGE(same_bytes(dst, y.g), "copy" << sfx << " [" << dtype_name(dt) << "] differs");
      }
  Tensor a = gpu().empty({8}, DType::kBF16, kTmp), b = gpu().empty({8}, DType::kF32, kTmp);
  BOOST_CHECK_THROW(gpu().add(a, b, 1.0f), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().copy(a, b), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(fill_writes_every_element) {
  for (DType dt : kDtypes)
    for (float value : {0.0f, 1.25f, 0.1f, -3.0f})
      for (int64_t n : {int64_t(1), int64_t(1003), int64_t(65536)}) {
        Pair x = output_pair({n}, dt);
        gpu().fill(x.g, value);
        const float expect = dt == DType::kBF16 ? float_from_bf16(bf16_from_float(value)) : value;
        const std::vector<float> h = host_values(gpu(), x.g);
        int64_t wrong = 0;
        for (float e : h) wrong += e != expect;
        BOOST_CHECK_MESSAGE(wrong == 0, "fill " << value << " [" << dtype_name(dt) << "] n=" << n << ": " << wrong
                                                << " elements differ");
      }
  Tensor i = gpu().empty({5}, DType::kI32, kTmp);
  BOOST_CHECK_THROW(gpu().fill(i, 1.0f), std::invalid_argument);
  gpu().fill(i, 0.0f);
  for (float e : host_values(gpu(), i)) BOOST_CHECK_EQUAL(e, 0.0f);
}

BOOST_AUTO_TEST_CASE(copy_columns_matches_cpu) {
  uint64_t seed = 1400;
  for (DType dt : kDtypes) {
    Pair dst = random_pair({37, 50}, dt, ++seed), src = random_pair({37, 30}, dt, ++seed);
    cpu().copy_columns(dst.c, 20, src.c, 5, 10);
    gpu().copy_columns(dst.g, 20, src.g, 5, 10);
    expect_close(dst, dt, "copy_columns", 1e-30);
    cpu().copy_columns(dst.c, 0, src.c, 0, 30);
    gpu().copy_columns(dst.g, 0, src.g, 0, 30);
    expect_close(dst, dt, "copy_columns leading block", 1e-30);
    BOOST_CHECK_THROW(gpu().copy_columns(dst.g, 45, src.g, 0, 10), std::invalid_argument);
    BOOST_CHECK_THROW(gpu().copy_columns(dst.g, 0, src.g, 25, 10), std::invalid_argument);
  }
}

BOOST_AUTO_TEST_CASE(cast_rounds_like_torch) {
  // Specials: ties to even (1 + 2^-8 → 1, 1 + 3·2^-8 → up), overflow to inf, subnormals, −0.
  std::vector<float> vals = {0.0f,         -0.0f,         1.0f,     -1.0f,    1.00390625f, 1.01171875f, -1.00390625f,
                             65504.0f,     3.3e38f,       FLT_MAX,  -FLT_MAX, INFINITY,    -INFINITY,   1e-40f,
                             -1e-40f,      FLT_MIN,       1e-45f,   0.1f,     3.14159265f, 1e30f,       -2.5e-20f};
  const std::vector<float> r = randn(1003, 1500, 10.0f);
  vals.insert(vals.end(), r.begin(), r.end());
  for (int64_t off : {0, 1}) {
    const int64_t n = int64_t(vals.size());
    Tensor src_buf = gpu().empty({n + off}, DType::kF32, kTmp), dst_buf = gpu().empty({n + off}, DType::kBF16, kTmp);
    Tensor src = src_buf.view({n}, off), dst = dst_buf.view({n}, off);
    gpu().upload(src, vals.data(), size_t(n) * 4);
    poison(dst);
    gpu().cast(dst, src);
    std::vector<uint16_t> bits(vals.size());
    gpu().download(bits.data(), dst, bits.size() * 2);
    int64_t wrong = 0;
    for (size_t i = 0; i < bits.size(); ++i) wrong += bits[i] != bf16_from_float(vals[i]);
    BOOST_CHECK_MESSAGE(wrong == 0, "cast f32->bf16" << (off ? " misaligned" : "") << ": " << wrong << " wrong");
    // bf16 → f32 is exact.
    Tensor back_buf = gpu().empty({n + off}, DType::kF32, kTmp);
    Tensor back = back_buf.view({n}, off);
    poison(back);
    gpu().cast(back, dst);
    std::vector<float> f(vals.size());
    gpu().download(f.data(), back, f.size() * 4);
    wrong = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      const float e = float_from_bf16(bits[i]);
      wrong += std::memcmp(&f[i], &e, 4) != 0;
    }
    BOOST_CHECK_MESSAGE(wrong == 0, "cast bf16->f32" << (off ? " misaligned" : "") << ": " << wrong << " wrong");
  }
  Tensor i = gpu().empty({4}, DType::kI32, kTmp), f = gpu().empty({4}, DType::kF32, kTmp);
  BOOST_CHECK_THROW(gpu().cast(f, i), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().cast(f, gpu().empty({5}, DType::kBF16, kTmp)), std::invalid_argument);
}

int main(int argc, char** argv) { return meshtrain::gputest::gpu_test_main(argc, argv); }
