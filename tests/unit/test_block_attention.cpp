// The block-attention forms of context parallelism (Device::attention_block_forward,
// attention_merge, attention_block_backward) on the CPU device, each against a direct fp64
// computation of softmax attention over explicit query and key positions.
#define BOOST_TEST_MODULE block_attention
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "device/cpu/cpu_device.hpp"
#include "util/rng.hpp"

using namespace meshtrain;

namespace {

constexpr int64_t B = 2, Hq = 4, Hkv = 2, Dh = 8;
constexpr float kScale = 0.35f;

Tensor randn(Device& d, const Shape& s, uint64_t stream) {
  Tensor t = d.empty(s, DType::kF32, MemCategory::kTemporaries);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = float(counter_normal(7, stream, uint64_t(i)));
  return t;
}

Tensor zeros(Device& d, const Shape& s) { return d.zeros(s, DType::kF32, MemCategory::kTemporaries); }

// Rows [first, first + n) of a [B, T, H, Dh] tensor as a new contiguous [B, n, H, Dh] tensor.
Tensor rows(Device& d, const Tensor& x, int64_t first, int64_t n) {
  const int64_t t = x.dim(1), w = x.dim(2) * x.dim(3);
  Tensor out = d.empty({x.dim(0), n, x.dim(2), x.dim(3)}, DType::kF32, MemCategory::kTemporaries);
  for (int64_t b = 0; b < x.dim(0); ++b)
    for (int64_t i = 0; i < n * w; ++i) out.f32()[b * n * w + i] = x.f32()[(b * t + first) * w + i];
  return out;
}

// Direct fp64 attention of queries at positions qpos over keys at kpos (key j visible when
// kpos[j] <= qpos[i] and, with `starts` (document start of each global position per sample),
// both lie in one document: an explicit mask), with the gradients of <dout, out>.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;  // [B, Tq, Hq, Dh], [B, Hq, Tq], like q / k / v
};

Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                    const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos,
                    const std::vector<std::vector<int32_t>>* starts = nullptr) {
  const int64_t tq = q.dim(1), tk = k.dim(1), g = Hq / Hkv;
  Reference r;
  r.out.assign(size_t(q.numel()), 0), r.lse.assign(size_t(B * Hq * tq), 0);
  r.dq.assign(size_t(q.numel()), 0), r.dk.assign(size_t(k.numel()), 0), r.dv.assign(size_t(k.numel()), 0);
  auto qi = [&](int64_t b, int64_t i, int64_t h, int64_t c) { return ((b * tq + i) * Hq + h) * Dh + c; };
  auto ki = [&](int64_t b, int64_t j, int64_t h, int64_t c) { return ((b * tk + j) * Hkv + h) * Dh + c; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < tq; ++i) {
        std::vector<double> s(size_t(tk), -std::numeric_limits<double>::infinity()), p(size_t(tk), 0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < tk; ++j) {
          if (kpos[size_t(j)] > qpos[size_t(i)]) continue;
          if (starts && (*starts)[size_t(b)][size_t(kpos[size_t(j)])] != (*starts)[size_t(b)][size_t(qpos[size_t(i)])])
            continue;
          double acc = 0;
          for (int64_t c = 0; c < Dh; ++c) acc += double(q.f32()[qi(b, i, h, c)]) * k.f32()[ki(b, j, h / g, c)];
          s[size_t(j)] = acc * kScale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = 0; j < tk; ++j) z += (p[size_t(j)] = std::isinf(s[size_t(j)]) ? 0 : std::exp(s[size_t(j)] - mx));
        if (z == 0) {  // the row sees no key: out 0, lse −inf, no gradient
          r.lse[size_t((b * Hq + h) * tq + i)] = -std::numeric_limits<double>::infinity();
          continue;
        }
        for (auto& x : p) x /= z;
        r.lse[size_t((b * Hq + h) * tq + i)] = mx + std::log(z);
        double dsum = 0;  // D = dO · O
        for (int64_t c = 0; c < Dh; ++c) {
          double o = 0;
          for (int64_t j = 0; j < tk; ++j) o += p[size_t(j)] * v.f32()[ki(b, j, h / g, c)];
          r.out[size_t(qi(b, i, h, c))] = o;
          dsum += o * dout.f32()[qi(b, i, h, c)];
        }
        for (int64_t j = 0; j < tk; ++j) {
          if (p[size_t(j)] == 0) continue;
          double dp = 0;
          for (int64_t c = 0; c < Dh; ++c) dp += double(dout.f32()[qi(b, i, h, c)]) * v.f32()[ki(b, j, h / g, c)];
          const double ds = p[size_t(j)] * (dp - dsum) * kScale;
          for (int64_t c = 0; c < Dh; ++c) {
            r.dq[size_t(qi(b, i, h, c))] += ds * k.f32()[ki(b, j, h / g, c)];
            r.dk[size_t(ki(b, j, h / g, c))] += ds * q.f32()[qi(b, i, h, c)];
            r.dv[size_t(ki(b, j, h / g, c))] += p[size_t(j)] * dout.f32()[qi(b, i, h, c)];
          }
        }
      }
  return r;
}

std::vector<int64_t> positions(int64_t first, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = first + i;
  return p;
}

// max |a − b| / (1 + |b|) over the elements (b the fp64 reference; −inf matches −inf only).
double max_err(const Tensor& a, const std::vector<double>& b) {
  double e = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isinf(b[size_t(i)]) || std::isinf(a.f32()[i])) {
      if (double(a.f32()[i]) != b[size_t(i)]) return std::numeric_limits<double>::infinity();
      continue;
    }
    e = std::max(e, std::fabs(a.f32()[i] - b[size_t(i)]) / (1 + std::fabs(b[size_t(i)])));
  }
  return e;
}

// Document starts of B samples of `t` tokens whose documents end at the given positions
// (inclusive, as a document's EOS token), and the device table DocumentMask reads.
std::vector<std::vector<int32_t>> doc_starts(int64_t t, const std::vector<std::vector<int64_t>>& ends) {
  std::vector<std::vector<int32_t>> s(ends.size(), std::vector<int32_t>(size_t(t)));
  for (size_t b = 0; b < ends.size(); ++b)
    for (int64_t p = 0, start = 0; p < t; ++p) {
      s[b][size_t(p)] = int32_t(start);
      for (int64_t e : ends[b])
        if (e == p) start = p + 1;
    }
  return s;
}
Tensor doc_table(Device& d, const std::vector<std::vector<int32_t>>& s) {
  Tensor t = d.empty({int64_t(s.size()), int64_t(s[0].size())}, DType::kI32, MemCategory::kTemporaries);
  for (size_t b = 0; b < s.size(); ++b)
    for (size_t p = 0; p < s[b].size(); ++p) t.i32()[b * s[b].size() + p] = s[b][p];
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(block_forward_no_mask_and_causal_match_fp64) {
  CpuDevice d(2);
  // kNone with Tq != Tk: queries at 12..16 see keys 0..6 (a key chunk wholly before them).
  Tensor q = randn(d, {B, 5, Hq, Dh}, 1), k = randn(d, {B, 7, Hkv, Dh}, 2), v = randn(d, {B, 7, Hkv, Dh}, 3);
  Tensor o = zeros(d, q.shape()), lse = zeros(d, {B, Hq, 5});
  d.attention_block_forward(q, k, v, AttentionMask::kNone, o, lse, kScale);
  Reference r = reference(q, k, v, zeros(d, q.shape()), positions(12, 5), positions(0, 7));
  BOOST_TEST(max_err(o, r.out) < 1e-6);
  BOOST_TEST(max_err(lse, r.lse) < 1e-6);
  // kCausal: the diagonal block.
  Tensor k2 = randn(d, {B, 5, Hkv, Dh}, 4), v2 = randn(d, {B, 5, Hkv, Dh}, 5);
  d.attention_block_forward(q, k2, v2, AttentionMask::kCausal, o, lse, kScale);
  r = reference(q, k2, v2, zeros(d, q.shape()), positions(3, 5), positions(3, 5));
  BOOST_TEST(max_err(o, r.out) < 1e-6);
  BOOST_TEST(max_err(lse, r.lse) < 1e-6);
}

BOOST_AUTO_TEST_CASE(blocks_merged_and_their_backwards_summed_equal_full_causal_attention) {
  // A causal sequence of 3 chunks of C tokens; the queries of chunk 2 see chunks 0 and 1 whole
  // and chunk 2 causally. Merging the three blocks in any order gives the full output and lse;
  // the block backwards with the merged out and lse sum to the full gradients.
  CpuDevice d(2);
  const int64_t C = 6, T = 3 * C;
  Tensor q = randn(d, {B, C, Hq, Dh}, 11), k = randn(d, {B, T, Hkv, Dh}, 12), v = randn(d, {B, T, Hkv, Dh}, 13);
  Tensor dout = randn(d, q.shape(), 14);
  Reference r = reference(q, k, v, dout, positions(2 * C, C), positions(0, T));
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, {2, 0, 1}, {1, 2, 0}}) {
    Tensor o = zeros(d, q.shape()), lse = d.empty({B, Hq, C}, DType::kF32, MemCategory::kTemporaries);
    d.fill(lse, -std::numeric_limits<float>::infinity());
    for (int c : order) {
      Tensor ob = zeros(d, q.shape()), lb = zeros(d, {B, Hq, C});
      d.attention_block_forward(q, rows(d, k, c * C, C), rows(d, v, c * C, C),
                                c == 2 ? AttentionMask::kCausal : AttentionMask::kNone, ob, lb, kScale);
      d.attention_merge(o, lse, ob, lb);
    }
    BOOST_TEST(max_err(o, r.out) < 2e-6);
    BOOST_TEST(max_err(lse, r.lse) < 2e-6);
    Tensor dq = zeros(d, q.shape());
    for (int c : order) {
      Tensor kc = rows(d, k, c * C, C), vc = rows(d, v, c * C, C);
      Tensor dk = randn(d, kc.shape(), 20 + c), dv = randn(d, vc.shape(), 30 + c);  // accumulates onto these
      const std::vector<float> dk0(dk.f32(), dk.f32() + dk.numel()), dv0(dv.f32(), dv.f32() + dv.numel());
      d.attention_block_backward(dout, q, kc, vc, c == 2 ? AttentionMask::kCausal : AttentionMask::kNone, o, lse,
                                 kScale, dq, dk, dv);
      const int64_t w = Hkv * Dh;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < C * w; ++i) {
          const size_t at = size_t((b * T + c * C) * w + i), here = size_t(b * C * w + i);
          BOOST_TEST(std::fabs(dk.f32()[here] - dk0[here] - r.dk[at]) < 2e-5 * (1 + std::fabs(r.dk[at])));
          BOOST_TEST(std::fabs(dv.f32()[here] - dv0[here] - r.dv[at]) < 2e-5 * (1 + std::fabs(r.dv[at])));
        }
    }
    BOOST_TEST(max_err(dq, r.dq) < 2e-5);
  }
}

BOOST_AUTO_TEST_CASE(merge_takes_the_block_where_nothing_was_seen_yet) {
  CpuDevice d(1);
  Tensor o = randn(d, {1, 2, 1, 3}, 40), lse = d.empty({1, 1, 2}, DType::kF32, MemCategory::kTemporaries);
  Tensor ob = randn(d, o.shape(), 41), lb = randn(d, lse.shape(), 42);
  lse.f32()[0] = -std::numeric_limits<float>::infinity(), lse.f32()[1] = 0.5f;
  lb.f32()[1] = -std::numeric_limits<float>::infinity();
  const std::vector<float> o1(o.f32() + 3, o.f32() + 6);
  d.attention_merge(o, lse, ob, lb);
  for (int c = 0; c < 3; ++c) BOOST_TEST(o.f32()[c] == ob.f32()[c]);  // row 0: the block's
  for (int c = 0; c < 3; ++c) BOOST_TEST(o.f32()[3 + c] == o1[size_t(c)]);  // row 1: unchanged
  BOOST_TEST(lse.f32()[0] == lb.f32()[0]);
  BOOST_TEST(lse.f32()[1] == 0.5f);
}

BOOST_AUTO_TEST_CASE(block_forms_reject_bad_shapes) {
  CpuDevice d(1);
  Tensor q = randn(d, {B, 5, Hq, Dh}, 1), k = randn(d, {B, 7, Hkv, Dh}, 2);
  Tensor o = zeros(d, q.shape()), lse = zeros(d, {B, Hq, 5});
  BOOST_CHECK_THROW(d.attention_block_forward(q, k, k, AttentionMask::kCausal, o, lse, 1), std::invalid_argument);
  BOOST_CHECK_THROW(d.attention_block_forward(q, k, k, AttentionMask::kNone, o, zeros(d, {B, Hq, 7}), 1),
                    std::invalid_argument);
  Tensor dk = zeros(d, k.shape());
  BOOST_CHECK_THROW(d.attention_block_backward(o, q, k, k, AttentionMask::kNone, o, lse, 1, zeros(d, q.shape()), dk,
                                               zeros(d, {B, 6, Hkv, Dh})),
                    std::invalid_argument);
  BOOST_CHECK_THROW(d.attention_merge(o, lse, zeros(d, {B, 4, Hq, Dh}), lse), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(document_masked_attention_matches_an_explicit_mask) {
  // Sample 0: documents [0, 4], [5], [6, 10], [11, 17] (a one-token document, one ending at the
  // last position); sample 1: one document (the mask is then plain causal).
  CpuDevice d(2);
  const int64_t T = 18;
  const auto starts = doc_starts(T, {{4, 5, 10}, {}});
  const DocumentMask docs{doc_table(d, starts)};
  Tensor q = randn(d, {B, T, Hq, Dh}, 51), k = randn(d, {B, T, Hkv, Dh}, 52), v = randn(d, {B, T, Hkv, Dh}, 53);
  Tensor dout = randn(d, q.shape(), 54);
  const Reference r = reference(q, k, v, dout, positions(0, T), positions(0, T), &starts);
  Tensor o = zeros(d, q.shape()), lse = zeros(d, {B, Hq, T});
  d.attention_forward(q, k, v, o, lse, kScale, docs);
  BOOST_TEST(max_err(o, r.out) < 1e-6);
  BOOST_TEST(max_err(lse, r.lse) < 1e-6);
  Tensor dq = zeros(d, q.shape()), dk = zeros(d, k.shape()), dv = zeros(d, v.shape());
  d.attention_backward(dout, q, k, v, o, lse, kScale, dq, dk, dv, docs);
  BOOST_TEST(max_err(dq, r.dq) < 2e-6);
  BOOST_TEST(max_err(dk, r.dk) < 2e-6);
  BOOST_TEST(max_err(dv, r.dv) < 2e-6);
  // Position 5 (a document of its own) sees only itself: its output is its value row.
  for (int64_t c = 0; c < Dh; ++c) BOOST_TEST(o.f32()[(5 * Hq + 0) * Dh + c] == v.f32()[(5 * Hkv + 0) * Dh + c]);
}

BOOST_AUTO_TEST_CASE(document_masked_blocks_merged_equal_full_document_attention) {
  // Context-parallel blocks read the same table through their offsets: the queries of chunk 2
  // (positions 12..17) against key chunks 0, 1 and 2. Sample 0's document starting at 9 leaves
  // chunk 0 wholly outside the mask of every query of chunk 2 (lse −inf, which the merge skips).
  CpuDevice d(2);
  const int64_t C = 6, T = 3 * C;
  const auto starts = doc_starts(T, {{8, 13}, {2}});
  const Tensor table = doc_table(d, starts);
  Tensor q = randn(d, {B, C, Hq, Dh}, 61), k = randn(d, {B, T, Hkv, Dh}, 62), v = randn(d, {B, T, Hkv, Dh}, 63);
  Tensor dout = randn(d, q.shape(), 64);
  const Reference r = reference(q, k, v, dout, positions(2 * C, C), positions(0, T), &starts);
  Tensor o = zeros(d, q.shape()), lse = d.empty({B, Hq, C}, DType::kF32, MemCategory::kTemporaries);
  d.fill(lse, -std::numeric_limits<float>::infinity());
  for (int c : {0, 1, 2}) {
    Tensor ob = zeros(d, q.shape()), lb = zeros(d, {B, Hq, C});
    d.attention_block_forward(q, rows(d, k, c * C, C), rows(d, v, c * C, C),
                              c == 2 ? AttentionMask::kCausal : AttentionMask::kNone, ob, lb, kScale,
                              DocumentMask{table, 2 * C, c * C});
    if (c == 0) BOOST_TEST(std::isinf(lb.f32()[0]));  // sample 0, head 0, position 12: nothing in chunk 0
    d.attention_merge(o, lse, ob, lb);
  }
  BOOST_TEST(max_err(o, r.out) < 2e-6);
  BOOST_TEST(max_err(lse, r.lse) < 2e-6);
  Tensor dq = zeros(d, q.shape());
  const int64_t w = Hkv * Dh;
  for (int c : {0, 1, 2}) {
    Tensor kc = rows(d, k, c * C, C), vc = rows(d, v, c * C, C), dk = zeros(d, kc.shape()), dv = zeros(d, vc.shape());
    d.attention_block_backward(dout, q, kc, vc, c == 2 ? AttentionMask::kCausal : AttentionMask::kNone, o, lse,
                               kScale, dq, dk, dv, DocumentMask{table, 2 * C, c * C});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < C * w; ++i) {
        const size_t at = size_t((b * T + c * C) * w + i), here = size_t(b * C * w + i);
        BOOST_TEST(std::fabs(dk.f32()[here] - r.dk[at]) < 2e-5 * (1 + std::fabs(r.dk[at])));
        BOOST_TEST(std::fabs(dv.f32()[here] - r.dv[at]) < 2e-5 * (1 + std::fabs(r.dv[at])));
      }
  }
  BOOST_TEST(max_err(dq, r.dq) < 2e-5);
}

BOOST_AUTO_TEST_CASE(document_mask_rejects_a_table_that_does_not_cover_the_call) {
  CpuDevice d(1);
  Tensor q = randn(d, {B, 4, Hq, Dh}, 71), k = randn(d, {B, 4, Hkv, Dh}, 72), v = randn(d, {B, 4, Hkv, Dh}, 73);
  Tensor o = zeros(d, q.shape()), lse = zeros(d, {B, Hq, 4});
  const Tensor table = doc_table(d, doc_starts(6, {{1}, {}}));
  BOOST_CHECK_THROW(d.attention_block_forward(q, k, v, AttentionMask::kNone, o, lse, kScale, DocumentMask{table, 4, 0}),
                    std::invalid_argument);  // queries 4..7 of a 6-position table
  const Tensor f32 = zeros(d, {B, 4});
  BOOST_CHECK_THROW(d.attention_forward(q, k, v, o, lse, kScale, DocumentMask{f32}), std::invalid_argument);
}
