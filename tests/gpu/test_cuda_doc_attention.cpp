// CudaDevice document-masked attention (DocumentMask, `[model] attn_mask_type = "block_causal"`)
// against CpuDevice's kernels, which tests/unit/test_block_attention.cpp checks against fp64 with
// an explicit mask. Inputs are identical on both devices (bf16-rounded for bf16); f32 runs the
// SIMT kernels (≤ 1e-5 normwise), bf16 the tensor-core kernels for Dh 64 / 128 and SIMT
// otherwise (≤ 1e-2).
//  - whole sequences (attention_forward / _backward): documents of 1 token, documents ending on
//    and across the 64-row tile boundaries, one running past the window, batch samples with
//    different layouts, GQA, the Llama 3.2 1B shape at T = 2048 with Brown-like documents;
//  - context-parallel blocks: the sequence cut into 2 or 4 chunks, every (query chunk, key
//    chunk ≤ it) block run with the table at the chunks' global offsets, unmasked or causal,
//    merged with attention_merge (blocks wholly outside a chunk's documents included: their rows
//    give lse −inf, which the merge skips), and the block backwards summed, against the CPU's
//    whole-sequence results;
//  - one document per sample gives exactly the causal kernels' bits; a bad doc_start is refused.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"

namespace meshtrain::gputest {
namespace {

/// One case: q [B, T, Hq, Dh], k, v [B, T, Hkv, Dh], and per sample the lengths of its documents
/// in order (their sum may exceed T: the last document runs past the window).
struct DocCase {
  int64_t b, t, hq, hkv, dh;
  std::vector<std::vector<int64_t>> docs;
};

std::string describe(const DocCase& c) {
  return "document attention B" + std::to_string(c.b) + " T" + std::to_string(c.t) + " Hq" + std::to_string(c.hq) +
         " Hkv" + std::to_string(c.hkv) + " Dh" + std::to_string(c.dh);
}

/// The [B, T] table of document starts (DocumentMask::doc_start) of c.docs.
std::vector<int32_t> start_table(const DocCase& c) {
  std::vector<int32_t> s(size_t(c.b * c.t));
  for (int64_t b = 0; b < c.b; ++b) {
    int64_t p = 0;
    for (int64_t len : c.docs[size_t(b)])
      for (int64_t i = 0; i < len && p < c.t; ++i, ++p) s[size_t(b * c.t + p)] = int32_t(p - i);
    BOOST_REQUIRE_MESSAGE(p == c.t, "documents of sample " << b << " cover " << p << " of " << c.t << " positions");
  }
  return s;
}

/// The same start table on both devices.
struct DocTables {
  Tensor c, g;
};
DocTables doc_tables(const DocCase& c) {
  const std::vector<int32_t> s = start_table(c);
  DocTables t{cpu().empty({c.b, c.t}, DType::kI32, MemCategory::kTemporaries),
              gpu().empty({c.b, c.t}, DType::kI32, MemCategory::kTemporaries)};
  cpu().upload(t.c, s.data(), s.size() * sizeof(int32_t));
  gpu().upload(t.g, s.data(), s.size() * sizeof(int32_t));
  return t;
}

/// Document lengths filling t tokens: lengths ~ 1 + Exp(mean − 1), rounded, from `seed`, the
/// last one running past the window.
std::vector<int64_t> random_docs(int64_t t, double mean, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::exponential_distribution<double> d(1.0 / std::max(1e-9, mean - 1.0));
  std::vector<int64_t> lens;
  for (int64_t p = 0; p < t;) {
    const int64_t n = 1 + int64_t(d(g));
    lens.push_back(n);
    p += n;
  }
  return lens;
}

std::vector<float> round_to(DType dt, std::vector<float> v) {
  if (dt == DType::kBF16)
    for (auto& x : v) x = float_from_bf16(bf16_from_float(x));
  return v;
}

const std::vector<DocCase>& cases() {
  static const std::vector<DocCase> c = {
      // Documents of 1 token, boundaries on the 64-row tiles (64, 128) and inside them, the last
      // document cut; sample 1 has a long first document and a run of short ones.
      {2, 300, 4, 2, 64, {{1, 63, 64, 5, 100, 200}, {130, 1, 1, 2, 300}}},
      {1, 300, 4, 1, 128, {{17, 47, 1, 90, 400}}},             // Dh 128, GQA 4
      {2, 150, 4, 2, 48, {{40, 40, 40, 40}, {1, 1, 1, 200}}},  // SIMT in both dtypes
      {1, 200, 2, 2, 64, {{200}}},                              // one document: causal
      {1, 37, 2, 1, 16, {{3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3}}},
  };
  return c;
}

/// attention_forward / attention_backward of one case on both devices. The backward gets the
/// CPU forward's out (rounded to the dtype) and lse on both, so it is tested on its own.
void check_whole(const DocCase& c, DType dt, uint64_t seed) {
  const Shape qs{c.b, c.t, c.hq, c.dh}, ks{c.b, c.t, c.hkv, c.dh}, ls{c.b, c.hq, c.t};
  const float scale = 1.0f / std::sqrt(float(c.dh));
  const std::string name = describe(c);
  const DocTables tab = doc_tables(c);
  const DocumentMask dc{tab.c}, dg{tab.g};

  const Pair q = random_pair(qs, dt, seed), k = random_pair(ks, dt, seed + 1), v = random_pair(ks, dt, seed + 2);
  const Pair out = output_pair(qs, dt), lse = output_pair(ls, DType::kF32);
  cpu().attention_forward(q.c, k.c, v.c, out.c, lse.c, scale, dc);
  gpu().attention_forward(q.g, k.g, v.g, out.g, lse.g, scale, dg);
  expect_close(out, dt, name + " out");
  expect_close(lse, dt, name + " lse");

  const Pair o_in = make_pair(qs, dt, round_to(dt, host_values(cpu(), out.c)));
  const Pair lse_in = make_pair(ls, DType::kF32, host_values(cpu(), lse.c));
  const Pair dout = random_pair(qs, dt, seed + 3);
  const Pair dq = output_pair(qs, dt), dk = output_pair(ks, dt), dv = output_pair(ks, dt);
  cpu().attention_backward(dout.c, q.c, k.c, v.c, o_in.c, lse_in.c, scale, dq.c, dk.c, dv.c, dc);
  gpu().attention_backward(dout.g, q.g, k.g, v.g, o_in.g, lse_in.g, scale, dq.g, dk.g, dv.g, dg);
  expect_close(dq, dt, name + " dq");
  expect_close(dk, dt, name + " dk");
  expect_close(dv, dt, name + " dv");
}

BOOST_AUTO_TEST_CASE(doc_attention_f32_matches_cpu) {
  uint64_t seed = 100;
  for (const DocCase& c : cases()) check_whole(c, DType::kF32, seed += 10);
}

BOOST_AUTO_TEST_CASE(doc_attention_bf16_matches_cpu) {
  uint64_t seed = 200;
  for (const DocCase& c : cases()) check_whole(c, DType::kBF16, seed += 10);
}

// The Llama 3.2 1B attention shape at T = 2048 with documents of ~450 tokens (Brown's ~3,600
// at 2048 positions would mostly be one document; shorter ones exercise the tile skipping).
BOOST_AUTO_TEST_CASE(doc_attention_bf16_realistic_shape) {
  const DocCase c{1, 2048, 32, 8, 64, {random_docs(2048, 450.0, 7)}};
  check_whole(c, DType::kBF16, 300);
}

/// Rows [t0, t0 + n) of x [B, T, W] as [B, n, W].
std::vector<float> take_rows(const std::vector<float>& x, int64_t b, int64_t t, int64_t w, int64_t t0, int64_t n) {
  std::vector<float> r(size_t(b * n * w));
  for (int64_t i = 0; i < b; ++i) std::copy_n(x.begin() + (i * t + t0) * w, n * w, r.begin() + i * n * w);
  return r;
}
/// Writes part [B, n, W] into rows [t0, t0 + n) of x [B, T, W].
void put_rows(std::vector<float>& x, const std::vector<float>& part, int64_t b, int64_t t, int64_t w, int64_t t0,
              int64_t n) {
  for (int64_t i = 0; i < b; ++i) std::copy_n(part.begin() + i * n * w, n * w, x.begin() + (i * t + t0) * w);
}

Tensor gpu_values(const Shape& s, DType dt, const std::vector<float>& v) {
  Tensor t = gpu().empty(s, dt, MemCategory::kTemporaries);
  set_values(gpu(), t, v);
  return t;
}

/// Context-parallel blocks of one case: the sequence in `nc` equal chunks, query chunk i against
/// key chunks j ≤ i (causal on the diagonal, unmasked below it), each with the whole table and
/// the chunks' global offsets. Forward: the blocks of a chunk merged from (0, −inf), against the
/// CPU's whole-sequence out and lse. Backward: with the CPU's out and lse, the blocks' f32
/// gradients summed, against the CPU's whole-sequence gradients. Normwise tolerance 1e-4 (f32:
/// the merges reorder f32 sums) or 2e-2 (bf16).
void check_blocks(const DocCase& c, int64_t nc, DType dt, uint64_t seed) {
  BOOST_REQUIRE(c.t % nc == 0);
  const int64_t b = c.b, t = c.t, n = t / nc, hq = c.hq, hkv = c.hkv, dh = c.dh, wq = hq * dh, wk = hkv * dh;
  const Shape qs{b, t, hq, dh}, ks{b, t, hkv, dh}, ls{b, hq, t};
  const Shape qcs{b, n, hq, dh}, kcs{b, n, hkv, dh}, lcs{b, hq, n};
  const float scale = 1.0f / std::sqrt(float(dh));
  const bool bf = dt == DType::kBF16;
  const double tl = bf ? 2e-2 : 1e-4;
  const std::string name = describe(c) + " in " + std::to_string(nc) + " cp chunks [" + dtype_name(dt) + "]";
  const DocTables tab = doc_tables(c);

  const std::vector<float> q = randn(shape_numel(qs), seed, 1.0f, bf), k = randn(shape_numel(ks), seed + 1, 1.0f, bf),
                           v = randn(shape_numel(ks), seed + 2, 1.0f, bf),
                           dout = randn(shape_numel(qs), seed + 3, 1.0f, bf);
  // The CPU reference on the whole sequence, in f32 on the same (rounded) values.
  const Pair qp = make_pair(qs, DType::kF32, q), kp = make_pair(ks, DType::kF32, k), vp = make_pair(ks, DType::kF32, v);
  const Pair op = output_pair(qs, DType::kF32), lp = output_pair(ls, DType::kF32);
  cpu().attention_forward(qp.c, kp.c, vp.c, op.c, lp.c, scale, DocumentMask{tab.c});
  const std::vector<float> ref_out = host_values(cpu(), op.c), ref_lse = host_values(cpu(), lp.c);
  const Pair dop = make_pair(qs, DType::kF32, dout), oin = make_pair(qs, DType::kF32, round_to(dt, ref_out));
  const Pair dq = output_pair(qs, DType::kF32), dk = output_pair(ks, DType::kF32), dv = output_pair(ks, DType::kF32);
  cpu().attention_backward(dop.c, qp.c, kp.c, vp.c, oin.c, lp.c, scale, dq.c, dk.c, dv.c, DocumentMask{tab.c});

  std::vector<Tensor> qc, kc, vc, doc, oc, lc;
  for (int64_t i = 0; i < nc; ++i) {
    qc.push_back(gpu_values(qcs, dt, take_rows(q, b, t, wq, i * n, n)));
    kc.push_back(gpu_values(kcs, dt, take_rows(k, b, t, wk, i * n, n)));
    vc.push_back(gpu_values(kcs, dt, take_rows(v, b, t, wk, i * n, n)));
    doc.push_back(gpu_values(qcs, dt, take_rows(dout, b, t, wq, i * n, n)));
    oc.push_back(gpu_values(qcs, dt, take_rows(round_to(dt, ref_out), b, t, wq, i * n, n)));
    lc.push_back(gpu_values(lcs, DType::kF32, take_rows(ref_lse, b * hq, t, 1, i * n, n)));
  }
  auto block_docs = [&](int64_t i, int64_t j) {
    DocumentMask m{tab.g};
    m.q_offset = i * n;
    m.k_offset = j * n;
    return m;
  };

  std::vector<float> out(size_t(b * t * wq)), lse(size_t(b * hq * t));
  for (int64_t i = 0; i < nc; ++i) {
    const Tensor acc_o = gpu_values(qcs, DType::kF32, std::vector<float>(size_t(shape_numel(qcs)), 0.0f));
    const Tensor acc_l = gpu_values(lcs, DType::kF32, std::vector<float>(size_t(shape_numel(lcs)), -INFINITY));
    for (int64_t j = i + 1; j-- > 0;) {
      const Tensor bo = gpu().empty(qcs, DType::kF32, MemCategory::kTemporaries),
                   bl = gpu().empty(lcs, DType::kF32, MemCategory::kTemporaries);
      poison(bo);
      poison(bl);
      gpu().attention_block_forward(qc[size_t(i)], kc[size_t(j)], vc[size_t(j)],
                                    j == i ? AttentionMask::kCausal : AttentionMask::kNone, bo, bl, scale,
                                    block_docs(i, j));
      gpu().attention_merge(acc_o, acc_l, bo, bl);
    }
    put_rows(out, host_values(gpu(), acc_o), b, t, wq, i * n, n);
    put_rows(lse, host_values(gpu(), acc_l), b * hq, t, 1, i * n, n);
  }
  auto check = [&](const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
    const double e = rel_error(got, ref);
    BOOST_TEST_MESSAGE(name << " " << what << ": rel err " << e);
    BOOST_CHECK_MESSAGE(e <= tl, name << " " << what << ": rel err " << e << " > " << tl);
  };
  check(out, ref_out, "merged out");
  check(lse, ref_lse, "merged lse");

  std::vector<Tensor> gq, gk, gv;
  for (int64_t i = 0; i < nc; ++i) {
    gq.push_back(gpu().zeros(qcs, DType::kF32, MemCategory::kTemporaries));
    gk.push_back(gpu().zeros(kcs, DType::kF32, MemCategory::kTemporaries));
    gv.push_back(gpu().zeros(kcs, DType::kF32, MemCategory::kTemporaries));
  }
  for (int64_t i = 0; i < nc; ++i)
    for (int64_t j = 0; j <= i; ++j)
      gpu().attention_block_backward(doc[size_t(i)], qc[size_t(i)], kc[size_t(j)], vc[size_t(j)],
                                     j == i ? AttentionMask::kCausal : AttentionMask::kNone, oc[size_t(i)],
                                     lc[size_t(i)], scale, gq[size_t(i)], gk[size_t(j)], gv[size_t(j)],
                                     block_docs(i, j));
  std::vector<float> sq(size_t(b * t * wq)), sk(size_t(b * t * wk)), sv(size_t(b * t * wk));
  for (int64_t i = 0; i < nc; ++i) {
    put_rows(sq, host_values(gpu(), gq[size_t(i)]), b, t, wq, i * n, n);
    put_rows(sk, host_values(gpu(), gk[size_t(i)]), b, t, wk, i * n, n);
    put_rows(sv, host_values(gpu(), gv[size_t(i)]), b, t, wk, i * n, n);
  }
  check(sq, host_values(cpu(), dq.c), "summed dq");
  check(sk, host_values(cpu(), dk.c), "summed dk");
  check(sv, host_values(cpu(), dv.c), "summed dv");
}

BOOST_AUTO_TEST_CASE(doc_attention_cp_blocks_match_cpu) {
  uint64_t seed = 400;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    check_blocks(cases()[0], 2, dt, seed += 10);  // chunks of 150: blocks partly inside documents
    check_blocks(cases()[0], 4, dt, seed += 10);  // chunks of 75: some blocks wholly outside
    check_blocks(cases()[1], 2, dt, seed += 10);  // Dh 128
    check_blocks(cases()[2], 2, dt, seed += 10);  // SIMT
    // 8 chunks of 64 at Llama 3.2 1B heads, ~100-token documents.
    check_blocks(DocCase{1, 512, 32, 8, 64, {random_docs(512, 100.0, 11)}}, 8, dt, seed += 10);
  }
}

// A key block that lies wholly before its query rows' documents: out 0 and lse −inf for every
// row (what attention_merge skips), and a backward that adds nothing.
BOOST_AUTO_TEST_CASE(doc_attention_block_outside_documents) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const DocCase c{1, 256, 2, 1, 64, {{100, 156}}};  // queries 128…255 lie in the document from 100
    const DocTables tab = doc_tables(c);
    DocumentMask m{tab.g};
    m.q_offset = 192;  // query chunk 192…255, key chunk 0…63: no key is visible
    m.k_offset = 0;
    const Shape qs{1, 64, 2, 64}, ks{1, 64, 1, 64}, ls{1, 2, 64};
    const Tensor q = gpu_values(qs, dt, randn(shape_numel(qs), 500, 1.0f, dt == DType::kBF16)),
                 k = gpu_values(ks, dt, randn(shape_numel(ks), 501, 1.0f, dt == DType::kBF16));
    const Tensor out = gpu().empty(qs, DType::kF32, MemCategory::kTemporaries),
                 lse = gpu().empty(ls, DType::kF32, MemCategory::kTemporaries);
    poison(out);
    poison(lse);
    gpu().attention_block_forward(q, k, k, AttentionMask::kNone, out, lse, 0.125f, m);
    for (float x : host_values(gpu(), out)) BOOST_REQUIRE_EQUAL(x, 0.0f);
    for (float x : host_values(gpu(), lse)) BOOST_REQUIRE_EQUAL(x, -INFINITY);
    const std::vector<float> g0 = randn(shape_numel(qs), 502), k0 = randn(shape_numel(ks), 503);
    const Tensor dq = gpu_values(qs, DType::kF32, g0), dk = gpu_values(ks, DType::kF32, k0),
                 dv = gpu_values(ks, DType::kF32, k0);
    gpu().attention_block_backward(q, q, k, k, AttentionMask::kNone, q, gpu_values(ls, DType::kF32, randn(128, 504)),
                                   0.125f, dq, dk, dv, m);
    BOOST_CHECK(host_values(gpu(), dq) == g0);
    BOOST_CHECK(host_values(gpu(), dk) == k0);
    BOOST_CHECK(host_values(gpu(), dv) == k0);
  }
}

// One document per sample is plain causal attention, and the kernels take the same path:
// bitwise the causal results, forward and backward, in both dtypes.
BOOST_AUTO_TEST_CASE(doc_attention_single_document_is_causal_bitwise) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const DocCase c{2, 200, 4, 2, 64, {{200}, {500}}};
    const DocTables tab = doc_tables(c);
    const Shape qs{c.b, c.t, c.hq, c.dh}, ks{c.b, c.t, c.hkv, c.dh}, ls{c.b, c.hq, c.t};
    const Pair q = random_pair(qs, dt, 600), k = random_pair(ks, dt, 601), v = random_pair(ks, dt, 602),
               dout = random_pair(qs, dt, 603);
    Tensor res[2][5];
    for (int masked = 0; masked < 2; ++masked) {
      const DocumentMask m = masked ? DocumentMask{tab.g} : DocumentMask{};
      Tensor* r = res[masked];
      r[0] = gpu().empty(qs, dt, MemCategory::kTemporaries);
      r[1] = gpu().empty(ls, DType::kF32, MemCategory::kTemporaries);
      gpu().attention_forward(q.g, k.g, v.g, r[0], r[1], 0.125f, m);
      r[2] = gpu().empty(qs, dt, MemCategory::kTemporaries);
      r[3] = gpu().empty(ks, dt, MemCategory::kTemporaries);
      r[4] = gpu().empty(ks, dt, MemCategory::kTemporaries);
      gpu().attention_backward(dout.g, q.g, k.g, v.g, r[0], r[1], 0.125f, r[2], r[3], r[4], m);
    }
    for (int i = 0; i < 5; ++i)
      BOOST_CHECK_MESSAGE(same_bytes(res[0][i], res[1][i]),
                          "output " << i << " [" << dtype_name(dt) << "] differs from the causal kernels'");
  }
}

BOOST_AUTO_TEST_CASE(doc_attention_rejects_bad_tables) {
  auto t = [](const Shape& s, DType d = DType::kF32) { return gpu().empty(s, d, MemCategory::kTemporaries); };
  const Tensor q = t({1, 8, 2, 16}), k = t({1, 8, 1, 16}), o = t({1, 8, 2, 16}), l = t({1, 2, 8});
  const Tensor dq = t({1, 8, 2, 16}), dk = t({1, 8, 1, 16}), dv = t({1, 8, 1, 16});
  // f32 instead of i32, the wrong batch, too short for the sequence, and a block whose key
  // offset runs past the table.
  for (const Tensor& bad : {t({1, 8}), t({2, 8}, DType::kI32), t({1, 7}, DType::kI32)}) {
    const DocumentMask m{bad};
    BOOST_CHECK_THROW(gpu().attention_forward(q, k, k, o, l, 0.25f, m), std::invalid_argument);
    BOOST_CHECK_THROW(gpu().attention_backward(o, q, k, k, o, l, 0.25f, dq, dk, dk, m), std::invalid_argument);
  }
  DocumentMask past{t({1, 12}, DType::kI32)};
  past.k_offset = 6;
  BOOST_CHECK_THROW(gpu().attention_block_forward(q, k, k, AttentionMask::kNone, o, l, 0.25f, past),
                    std::invalid_argument);
  BOOST_CHECK_THROW(gpu().attention_block_backward(o, q, k, k, AttentionMask::kNone, o, l, 0.25f, dq, dk, dv, past),
                    std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain::gputest

int main(int argc, char** argv) { return meshtrain::gputest::gpu_test_main(argc, argv); }
