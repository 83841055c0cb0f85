// bfloat16 reductions through MpiCommunicator's user-defined MPI ops, and StagedCommunicator over
// CpuDevice (host memory, but every collective still goes download → MPI → upload), on 3 ranks.
// Expected values are computed on every rank from the rank numbers alone.
#define BOOST_TEST_MODULE staged_comm
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <vector>

#include "comm/staged_communicator.hpp"
#include "device/device.hpp"
#include "mpi/mpi_fixture.hpp"
#include "tensor_values.hpp"
#include "tensor/bf16.hpp"

using namespace meshtrain;
using meshtrain::testing::MpiFixture;

BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

int64_t sent(const Communicator& c, CollectiveKind k) { return c.bytes_sent()[int(k)]; }

Tensor make(Device& dev, DType dt, const std::vector<float>& v) {
  Tensor t = dev.empty({int64_t(v.size())}, dt, MemCategory::kCommunication);
  testing::set_tensor_values(dev, t, v);
  return t;
}

std::vector<float> values(Device& dev, const Tensor& t) { return testing::tensor_values(dev, t); }

std::unique_ptr<Device> cpu_device() { return make_device("cpu", 1); }

}  // namespace

// The bf16 user ops on plain host tensors, no staging.
BOOST_AUTO_TEST_CASE(mpi_bf16_reductions) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto dev = cpu_device();
  const int me = world.rank(), n = world.size();
  BOOST_REQUIRE_GE(n, 2);
  // Small integers keep every partial sum exact in bf16 (8 significant bits), so the result does
  // not depend on MPI's combination order.
  Tensor t = make(*dev, DType::kBF16, {float(me + 1), float(-2 * me), 0.5f * float(me)});
  world.all_reduce(t, ReduceOp::kSum)->wait();
  auto v = values(*dev, t);
  float s0 = 0, s1 = 0, s2 = 0;
  for (int r = 0; r < n; ++r) s0 += float(r + 1), s1 += float(-2 * r), s2 += 0.5f * float(r);
  BOOST_TEST(v[0] == s0);
  BOOST_TEST(v[1] == s1);
  BOOST_TEST(v[2] == s2);

  // Round to nearest even: 256 + 1 = 257 is a tie between bf16 neighbours 256 and 258 and goes
  // to 256 in every combination order (the other ranks add 0).
  Tensor tie = make(*dev, DType::kBF16, {me == 0 ? 256.0f : me == 1 ? 1.0f : 0.0f});
  world.all_reduce(tie, ReduceOp::kSum)->wait();
  BOOST_TEST(values(*dev, tie)[0] == 256.0f);

  // max / min compare values, not bit patterns (negative bf16 have larger bit patterns).
  Tensor mx = make(*dev, DType::kBF16, {-1.5f * float(me + 1), float(me) - 1.0f});
  Tensor mn = make(*dev, DType::kBF16, {-1.5f * float(me + 1), float(me) - 1.0f});
  world.all_reduce(mx, ReduceOp::kMax)->wait();
  world.all_reduce(mn, ReduceOp::kMin)->wait();
  BOOST_TEST(values(*dev, mx)[0] == -1.5f);
  BOOST_TEST(values(*dev, mx)[1] == float(n - 2));
  BOOST_TEST(values(*dev, mn)[0] == -1.5f * float(n));
  BOOST_TEST(values(*dev, mn)[1] == -1.0f);

  // reduce_scatter: block k of the sum lands on rank k.
  std::vector<float> in(size_t(2 * n));
  for (int j = 0; j < 2 * n; ++j) in[size_t(j)] = float(me + j);
  Tensor rin = make(*dev, DType::kBF16, in), rout = make(*dev, DType::kBF16, {0, 0});
  world.reduce_scatter(rin, rout, ReduceOp::kSum)->wait();
  auto rv = values(*dev, rout);
  for (int j = 0; j < 2; ++j) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += float(r + 2 * me + j);
    BOOST_TEST(rv[size_t(j)] == want);
  }
}

// Every collective of StagedCommunicator over CpuDevice, in f32, bf16 and i32.
BOOST_AUTO_TEST_CASE(staged_collectives_on_cpu_device) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto dev = cpu_device();
  StagedCommunicator c(world, *dev);
  const int me = c.rank(), n = c.size();
  BOOST_TEST(n == world.size());
  BOOST_TEST(c.name() == "world");

  for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
    BOOST_TEST_CONTEXT("dtype " << dtype_name(dt)) {
      // all_reduce sum / max
      Tensor t = make(*dev, dt, {float(me + 1), float(3 * me), 7.0f});
      c.all_reduce(t, ReduceOp::kSum)->wait();
      auto v = values(*dev, t);
      BOOST_TEST(v[0] == float(n * (n + 1) / 2));
      BOOST_TEST(v[1] == float(3 * n * (n - 1) / 2));
      BOOST_TEST(v[2] == float(7 * n));
      Tensor m = make(*dev, dt, {float(me), float(-me)});
      c.all_reduce(m, ReduceOp::kMax)->wait();
      BOOST_TEST(values(*dev, m)[0] == float(n - 1));
      BOOST_TEST(values(*dev, m)[1] == 0.0f);

      // reduce_scatter
      std::vector<float> in(size_t(2 * n));
      for (int j = 0; j < 2 * n; ++j) in[size_t(j)] = float(10 * me + j);
      Tensor rin = make(*dev, dt, in), rout = make(*dev, dt, {-1, -1});
      c.reduce_scatter(rin, rout, ReduceOp::kSum)->wait();
      auto rv = values(*dev, rout);
      for (int j = 0; j < 2; ++j) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += float(10 * r + 2 * me + j);
        BOOST_TEST(rv[size_t(j)] == want);
      }
      BOOST_TEST(values(*dev, rin) == in, boost::test_tools::per_element());  // input untouched

      // all_gather, completed through test() (the upload happens there)
      Tensor gin = make(*dev, dt, {float(me), float(me + 100)});
      Tensor gout = make(*dev, dt, std::vector<float>(size_t(2 * n), -1.0f));
      auto w = c.all_gather(gin, gout);
      while (!w->test()) {
      }
      BOOST_TEST(w->test());
      auto gv = values(*dev, gout);
      for (int r = 0; r < n; ++r) {
        BOOST_TEST(gv[size_t(2 * r)] == float(r));
        BOOST_TEST(gv[size_t(2 * r + 1)] == float(r + 100));
      }

      // broadcast from the last rank
      Tensor b = make(*dev, dt, {float(me), float(2 * me)});
      c.broadcast(b, n - 1)->wait();
      BOOST_TEST(values(*dev, b)[0] == float(n - 1));
      BOOST_TEST(values(*dev, b)[1] == float(2 * (n - 1)));

      // send / recv around a ring (receive posted first, so no ordering deadlock)
      Tensor sbuf = make(*dev, dt, {float(me + 1), float(me + 2), float(me + 3)});
      Tensor rbuf = make(*dev, dt, {0, 0, 0});
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      auto rw = c.recv(rbuf, prev, 7);
      auto sw = c.send(sbuf, next, 7);
      sw->wait();
      rw->wait();
      auto recv_v = values(*dev, rbuf);
      for (int j = 0; j < 3; ++j) BOOST_TEST(recv_v[size_t(j)] == float(prev + 1 + j));

      // all_to_all: block j of rank i lands as block i of rank j
      std::vector<float> a2a(size_t(2 * n));
      for (int j = 0; j < n; ++j) a2a[size_t(2 * j)] = float(me * 10 + j), a2a[size_t(2 * j + 1)] = float(-j);
      Tensor ain = make(*dev, dt, a2a), aout = make(*dev, dt, std::vector<float>(size_t(2 * n), 0.0f));
      c.all_to_all(ain, aout)->wait();
      auto av = values(*dev, aout);
      for (int i = 0; i < n; ++i) {
        BOOST_TEST(av[size_t(2 * i)] == float(i * 10 + me));
        BOOST_TEST(av[size_t(2 * i + 1)] == float(-me));
      }
    }
  }
}

// A Work dropped without wait() still delivers its result (as MpiWork's destructor waits), and
// a mismatched call throws before any MPI traffic.
BOOST_AUTO_TEST_CASE(staged_work_destructor_and_errors) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto dev = cpu_device();
  StagedCommunicator c(world, *dev);
  const int n = c.size();
  Tensor t = make(*dev, DType::kF32, {1.0f, 2.0f});
  { auto dropped = c.all_reduce(t, ReduceOp::kSum); }
  auto v = values(*dev, t);
  BOOST_TEST(v[0] == float(n));
  BOOST_TEST(v[1] == float(2 * n));

  Tensor in = make(*dev, DType::kF32, {1, 2, 3}), out = make(*dev, DType::kF32, {0});
  BOOST_CHECK_THROW(c.all_gather(in, out), std::invalid_argument);
  Tensor in2 = make(*dev, DType::kF32, std::vector<float>(size_t(n), 1.0f));
  Tensor out2 = make(*dev, DType::kBF16, {0});
  BOOST_CHECK_THROW(c.reduce_scatter(in2, out2, ReduceOp::kSum), std::invalid_argument);
  c.barrier();
  double h[2] = {1.0, double(c.rank())};
  c.all_reduce_host(h, 2, ReduceOp::kSum);
  BOOST_TEST(h[0] == double(n));
  BOOST_TEST(h[1] == double(n * (n - 1) / 2));
}

// Bytes are counted once, in the staged communicator, with MpiCommunicator's ring formulas.
BOOST_AUTO_TEST_CASE(staged_byte_counts) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto dev = cpu_device();
  StagedCommunicator c(world, *dev);
  const int me = c.rank(), n = c.size();
  Tensor t = make(*dev, DType::kF32, std::vector<float>(size_t(6 * n), 1.0f));  // S = 24·n bytes
  const int64_t S = int64_t(t.nbytes());
  c.all_reduce(t, ReduceOp::kSum)->wait();
  BOOST_TEST(sent(c, CollectiveKind::kAllReduce) == 2 * S * (n - 1) / n);
  Tensor out = make(*dev, DType::kF32, std::vector<float>(6, 0.0f));
  c.reduce_scatter(t, out, ReduceOp::kSum)->wait();
  BOOST_TEST(sent(c, CollectiveKind::kReduceScatter) == S * (n - 1) / n);
  c.all_gather(out, t)->wait();
  BOOST_TEST(sent(c, CollectiveKind::kAllGather) == S * (n - 1) / n);
  c.broadcast(t, 0)->wait();
  BOOST_TEST(sent(c, CollectiveKind::kBroadcast) == (me == 0 ? S : 0));
  Tensor a2a_out = make(*dev, DType::kF32, std::vector<float>(size_t(6 * n), 0.0f));
  c.all_to_all(t, a2a_out)->wait();
  BOOST_TEST(sent(c, CollectiveKind::kAllToAll) == S * (n - 1) / n);
  BOOST_TEST(sent(c, CollectiveKind::kSendRecv) == 0);
}
