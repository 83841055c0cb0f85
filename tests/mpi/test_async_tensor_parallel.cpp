#define BOOST_TEST_MODULE async_tensor_parallel
// Async TP's fused operators (model/async_tensor_parallel.hpp) on 4 ranks, as tp groups of 2
// (two groups), 3 (the fourth rank alone) and 4, against the synchronous composition on the same
// data: every rank holds different rows, whose magnitudes span six orders, and each call mixes
// forward (A · Wᵀ) and input-gradient (A · W) GEMMs. Two row counts per rank: 32, a multiple of
// OpenBLAS's 16-row kernel blocks (the cpu device cuts its own thread blocks there too), where a
// row block's GEMM is bitwise the same rows of the whole GEMM; and 5, where the kernel's tail
// rows round differently (~1e-7).
// - all_gather_matmul: the gathered operand equals tp_enter's bit for bit, every product the
//   whole GEMM over it (bit for bit at 32 rows, within 1e-6 of the largest element at 5);
// - matmul_reduce_scatter: equals the accumulated GEMMs followed by tp_exit within 1e-6 (only
//   the order of the sum over ranks differs), bit for bit at tp 2 with 32 rows;
// - both move the bytes of the collective they replace, as ring send/recv (no all-gather or
//   reduce-scatter is issued);
// - the same with Float8 linears (tensorwise, rowwise, rowwise_with_gw_hp; weights split over tp
//   so that the casts' amax all-reduces run as in training);
// - misuse throws std::invalid_argument (async off, rows tp does not divide).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "model/async_tensor_parallel.hpp"
#include "mpi/mpi_fixture.hpp"
#include "mpi/tp_setup.hpp"
#include "tensor/float8.hpp"

using namespace meshtrain;

using testing::MpiFixture;
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

// A [rows, cols] tensor of values u·10^e (u in ±1, e in [−3, 3)), different per seed.
Tensor random_tensor(Device& dev, int64_t rows, int64_t cols, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-3.0f, 3.0f);
  std::vector<float> host(size_t(rows * cols));
  for (float& v : host) v = u(gen) * std::pow(10.0f, std::floor(e(gen)));
  Tensor t = dev.empty({rows, cols}, DType::kF32, MemCategory::kTemporaries);
  dev.upload(t, host.data(), host.size() * sizeof(float));
  return t;
}

// A weight W [out, in], the same on every rank of the group (its seed does not depend on rank).
Parameter weight(Device& dev, const std::string& name, int64_t out, int64_t in, unsigned seed) {
  Parameter p = make_parameter(name, {out, in}, InitSpec{InitSpec::Kind::kOnes, 0, 0});
  p.value = random_tensor(dev, out, in, seed);
  return p;
}

std::vector<float> host_of(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

// max |a − b| / max |b|.
double rel_err(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, double(std::abs(a.f32()[i] - b.f32()[i])));
    scale = std::max(scale, double(std::abs(b.f32()[i])));
  }
  return diff / scale;
}

int64_t sent(const Communicator& c, CollectiveKind k) { return c.bytes_sent()[int(k)]; }

// a == b bit for bit when `bitwise`, else within 1e-6 of b's largest element.
void check_close(const Tensor& a, const Tensor& b, bool bitwise, const char* what) {
  BOOST_TEST_REQUIRE(a.numel() == b.numel());
  if (bitwise) {
    BOOST_TEST(host_of(a) == host_of(b), boost::test_tools::per_element());
    return;
  }
  const double err = rel_err(a, b);
  BOOST_TEST_MESSAGE(what << ": max rel err " << err);
  BOOST_TEST(err <= 1e-6, what << ": max rel err " << err);
}

// Marks w as a Float8 linear under `recipe` ("": none) split over tp along tp_dim, so that
// scaling groups the split cuts take their amax over tp (as convert_float8_linears sets it up).
void float8(Parameter& w, const std::string& recipe, int tp_dim, Communicator* tp) {
  w.sharding.tp_dim = tp_dim;
  if (recipe.empty()) return;
  w.float8 = std::make_shared<Float8LinearRecipe>(float8_linear_recipe(recipe));
  w.float8_tp = tp;
}

void check_tp(int size, int64_t rows, const std::string& recipe) {
  testing::TpSetup s(size, true, true);
  if (s.tp.size != size) return;  // the rank left over by a group size that does not divide 4
  s.tp.async = true;
  Device& dev = *s.dev;
  const TensorParallel& tp = s.tp;
  const int64_t d = 12, n = rows * size;
  const bool aligned = rows % 16 == 0;
  const unsigned r = unsigned(tp.rank);
  StepContext ctx;  // for linear_backward, the synchronous input gradient
  ctx.dev = &dev;
  BOOST_TEST_CONTEXT("tp " << size << ", rank " << tp.rank << ", " << rows << " rows, float8 '" << recipe << "'") {
    // Column-parallel entry: x [n/tp, d] gathered, then two forward GEMMs (column-parallel
    // weights) and one input gradient (a row-parallel weight's, as for dout · Wo).
    Parameter w1 = weight(dev, "w1", 7, d, 11), w2 = weight(dev, "w2", 9, d, 12), w3 = weight(dev, "w3", d, 6, 13);
    float8(w1, recipe, 0, s.comm.get());
    float8(w2, recipe, 0, s.comm.get());
    float8(w3, recipe, 1, s.comm.get());
    const Tensor x = random_tensor(dev, rows, d, 100 + r);
    const int64_t gathered_before = sent(*s.comm, CollectiveKind::kAllGather);
    const Tensor want_x = tp_enter(dev, tp, x);
    const int64_t gather_bytes = sent(*s.comm, CollectiveKind::kAllGather) - gathered_before;
    const int64_t p2p_before = sent(*s.comm, CollectiveKind::kSendRecv);
    const AllGatherMatmul got = all_gather_matmul(
        dev, tp, x, {{&w1, LinearGemm::kForward}, {&w2, LinearGemm::kForward}, {&w3, LinearGemm::kInputGrad}});
    BOOST_TEST(sent(*s.comm, CollectiveKind::kSendRecv) - p2p_before == gather_bytes);
    BOOST_TEST(sent(*s.comm, CollectiveKind::kAllGather) - gathered_before == gather_bytes);  // none issued
    BOOST_TEST(host_of(got.gathered) == host_of(want_x), boost::test_tools::per_element());
    BOOST_TEST_REQUIRE(got.outs.size() == 3u);
    check_close(got.outs[0], linear_forward(dev, want_x, w1), aligned, "all_gather_matmul vs tp_enter + linear");
    check_close(got.outs[1], linear_forward(dev, want_x, w2), aligned, "all_gather_matmul vs tp_enter + linear");
    w3.grad = dev.empty({d, 6}, DType::kF32, MemCategory::kTemporaries);
    dev.fill(w3.grad, 0.0f);
    const Tensor unused_x = random_tensor(dev, n, 6, 1);
    check_close(got.outs[2], linear_backward(ctx, want_x, unused_x, w3), aligned,
                "all_gather_matmul vs tp_enter + linear input gradient");

    // Row-parallel exit: this rank's partial h · Waᵀ + g · Wb [n, d] reduce-scattered (the
    // forward of a row-parallel weight and the input gradient of a column-parallel one).
    Parameter wa = weight(dev, "wa", d, 8, 21), wb = weight(dev, "wb", 5, d, 22);
    float8(wa, recipe, 1, s.comm.get());
    float8(wb, recipe, 0, s.comm.get());
    wb.grad = dev.empty({5, d}, DType::kF32, MemCategory::kTemporaries);
    dev.fill(wb.grad, 0.0f);
    const Tensor h = random_tensor(dev, n, 8, 200 + r), g = random_tensor(dev, n, 5, 300 + r);
    const Tensor partial = linear_forward(dev, h, wa);
    linear_backward(ctx, g, random_tensor(dev, n, d, 2), wb, &partial);
    const int64_t rs_before = sent(*s.comm, CollectiveKind::kReduceScatter);
    const Tensor want_shard = tp_exit(dev, tp, partial);
    const int64_t rs_bytes = sent(*s.comm, CollectiveKind::kReduceScatter) - rs_before;
    const int64_t p2p_rs = sent(*s.comm, CollectiveKind::kSendRecv);
    const Tensor shard =
        matmul_reduce_scatter(dev, tp, {h, g}, {{&wa, LinearGemm::kForward}, {&wb, LinearGemm::kInputGrad}});
    BOOST_TEST(sent(*s.comm, CollectiveKind::kSendRecv) - p2p_rs == rs_bytes);
    check_close(shard, want_shard, aligned && size == 2, "matmul_reduce_scatter vs matmul + tp_exit");

    // Misuse: async off, rows that tp does not divide.
    TensorParallel off = tp;
    off.async = false;
    BOOST_CHECK_THROW(all_gather_matmul(dev, off, x, {{&w1, LinearGemm::kForward}}), std::invalid_argument);
    BOOST_CHECK_THROW(matmul_reduce_scatter(dev, off, {h}, {{&wa, LinearGemm::kForward}}), std::invalid_argument);
    const Tensor odd = random_tensor(dev, n + 1, 8, 7);
    BOOST_CHECK_THROW(matmul_reduce_scatter(dev, tp, {odd}, {{&wa, LinearGemm::kForward}}), std::invalid_argument);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(fused_operators_match_the_synchronous_collectives) {
  for (const int64_t rows : {32, 5})
    for (const int size : {2, 3, 4}) check_tp(size, rows, "");
}

// Float8 linears (emulated on the cpu device): the casts take the whole operand's amax (over tp
// where the groups span the split), so the fused operators still match the synchronous path.
BOOST_AUTO_TEST_CASE(fused_operators_match_the_synchronous_collectives_under_float8) {
  for (const char* recipe : {"tensorwise", "rowwise", "rowwise_with_gw_hp"})
    for (const int size : {2, 4}) check_tp(size, 32, recipe);
  check_tp(3, 5, "tensorwise");
}
