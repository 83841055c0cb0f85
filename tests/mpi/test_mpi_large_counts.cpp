// MPI transfers past 2^31 elements (comm/mpi/mpi_chunking.hpp). The chunk planning is a pure
// function, checked here with counts such as 2^31 + 5 and 3 · 2^31 that cannot be allocated in
// a test. The chunked MPI paths are then exercised on small tensors by lowering the process-wide
// chunk limit to a few elements (limits that divide none of the sizes), on 2 and 3 ranks: every
// operation of MpiCommunicator and of StagedCommunicator over the CPU device must give the same
// bytes as with the default limit (one MPI call per operation), and the values computed on every
// rank from the rank numbers alone. Values are multiples of 1/2 small enough that every partial
// sum is exact in bf16 and f32, so the comparison does not depend on MPI's combination order.
#define BOOST_TEST_MODULE mpi_large_counts
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi/mpi_chunking.hpp"
#include "comm/staged_communicator.hpp"
#include "device/device.hpp"
#include "mpi/mpi_fixture.hpp"
#include "tensor_values.hpp"
#include "util/errors.hpp"

using namespace meshtrain;
using meshtrain::testing::MpiFixture;

BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

// Sums the chunks and checks they tile [0, n) in order, each within [1, max_count].
void check_tiling(const std::vector<MpiChunk>& chunks, int64_t n, int64_t max_count) {
  int64_t next = 0;
  for (const MpiChunk& c : chunks) {
    BOOST_TEST(c.offset == next);
    BOOST_TEST(c.count >= 1);
    BOOST_TEST(int64_t(c.count) <= max_count);
    next += c.count;
  }
  BOOST_TEST(next == n);
}

// Restores the default chunk limit when a test case ends, also when it fails.
struct DefaultLimitAtExit {
  ~DefaultLimitAtExit() { set_mpi_max_count_for_testing(kMpiDefaultMaxCount); }
};

// Element i of rank r's input number `salt`: multiples of 1/2 in [-10, 10] (integers for i32),
// so sums over 3 ranks stay exact in bf16's 8 significant bits.
float value(int r, int64_t i, int salt, DType dt) {
  const int64_t k = (int64_t(r) * 131 + i * 17 + int64_t(salt) * 7) % 41 - 20;
  return dt == DType::kI32 ? float(k / 2) : 0.5f * float(k);
}

std::vector<float> values_of(int r, int64_t n, int salt, DType dt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(r, i, salt, dt);
  return v;
}

Tensor make(Device& dev, DType dt, const std::vector<float>& v) {
  Tensor t = dev.empty({int64_t(v.size())}, dt, MemCategory::kCommunication);
  testing::set_tensor_values(dev, t, v);
  return t;
}

std::vector<uint8_t> bytes_of(Device& dev, const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  if (!b.empty()) dev.download(b.data(), t, t.nbytes());
  return b;
}

// The result of every operation, in issue order, as bytes (compared across chunk limits).
struct Results {
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> bytes;
  void add(Device& dev, const std::string& name, const Tensor& t) {
    names.push_back(name);
    bytes.push_back(bytes_of(dev, t));
  }
};

const std::vector<int64_t> kFlatSizes = {0, 1, 2, 7, 10, 23};   // whole tensors
const std::vector<int64_t> kBlockSizes = {0, 1, 2, 5, 7, 11};   // per-rank blocks

// Every collective and point-to-point operation of `c` on tensors of `dev`, each result checked
// against the values computed from the rank numbers, and returned for the bitwise comparison.
Results run_all(Communicator& c, Device& dev) {
  Results res;
  const int me = c.rank(), n = c.size();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
    BOOST_TEST_CONTEXT("dtype " << dtype_name(dt)) {
      for (int64_t len : kFlatSizes) {
        BOOST_TEST_CONTEXT("flat size " << len) {
          const std::string tag = std::string(dtype_name(dt)) + " size " + std::to_string(len);
          // all_reduce sum, waited for; max, completed through test().
          Tensor s = make(dev, dt, values_of(me, len, 1, dt));
          c.all_reduce(s, ReduceOp::kSum)->wait();
          Tensor m = make(dev, dt, values_of(me, len, 2, dt));
          auto mw = c.all_reduce(m, ReduceOp::kMax);
          while (!mw->test()) {
          }
          const auto sv = testing::tensor_values(dev, s), mv = testing::tensor_values(dev, m);
          for (int64_t i = 0; i < len; ++i) {
            float sum = 0, mx = value(0, i, 2, dt);
            for (int r = 0; r < n; ++r) sum += value(r, i, 1, dt), mx = std::max(mx, value(r, i, 2, dt));
            BOOST_TEST(sv[size_t(i)] == sum);
            BOOST_TEST(mv[size_t(i)] == mx);
          }
          res.add(dev, "all_reduce sum " + tag, s);
          res.add(dev, "all_reduce max " + tag, m);

          // broadcast from the last rank, its Work dropped without wait (the destructor waits).
          Tensor b = make(dev, dt, values_of(me, len, 3, dt));
          { auto dropped = c.broadcast(b, n - 1); }
          BOOST_TEST(testing::tensor_values(dev, b) == values_of(n - 1, len, 3, dt), boost::test_tools::per_element());
          res.add(dev, "broadcast " + tag, b);

          // send / recv around the ring, receive posted first.
          Tensor snd = make(dev, dt, values_of(me, len, 4, dt));
          Tensor rcv = make(dev, dt, std::vector<float>(size_t(len), 0.0f));
          const int next = (me + 1) % n, prev = (me + n - 1) % n;
          auto rw = c.recv(rcv, prev, 11);
          auto sw = c.send(snd, next, 11);
          sw->wait();
          rw->wait();
          BOOST_TEST(testing::tensor_values(dev, rcv) == values_of(prev, len, 4, dt), boost::test_tools::per_element());
          res.add(dev, "send/recv " + tag, rcv);
        }
      }
      for (int64_t blk : kBlockSizes) {
        BOOST_TEST_CONTEXT("block size " << blk) {
          const std::string tag = std::string(dtype_name(dt)) + " block " + std::to_string(blk);
          // reduce_scatter sum and max: block `me` of the reduction lands here; input untouched.
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
            const int salt = op == ReduceOp::kSum ? 5 : 6;
            const auto in_v = values_of(me, n * blk, salt, dt);
            Tensor in = make(dev, dt, in_v), out = make(dev, dt, std::vector<float>(size_t(blk), -99.0f));
            c.reduce_scatter(in, out, op)->wait();
            const auto ov = testing::tensor_values(dev, out);
            for (int64_t i = 0; i < blk; ++i) {
              float want = value(0, me * blk + i, salt, dt);
              for (int r = 1; r < n; ++r) {
                const float x = value(r, me * blk + i, salt, dt);
                want = op == ReduceOp::kSum ? want + x : std::max(want, x);
              }
              BOOST_TEST(ov[size_t(i)] == want);
            }
            BOOST_TEST(testing::tensor_values(dev, in) == in_v, boost::test_tools::per_element());
            res.add(dev, std::string("reduce_scatter ") + (op == ReduceOp::kSum ? "sum " : "max ") + tag, out);
          }

          // all_gather: block r of out is rank r's input.
          Tensor gin = make(dev, dt, values_of(me, blk, 7, dt));
          Tensor gout = make(dev, dt, std::vector<float>(size_t(n * blk), -99.0f));
          c.all_gather(gin, gout)->wait();
          const auto gv = testing::tensor_values(dev, gout);
          for (int r = 0; r < n; ++r)
            for (int64_t i = 0; i < blk; ++i) BOOST_TEST(gv[size_t(r * blk + i)] == value(r, i, 7, dt));
          res.add(dev, "all_gather " + tag, gout);

          // all_to_all: block i of out is block `me` of rank i's input.
          Tensor ain = make(dev, dt, values_of(me, n * blk, 8, dt));
          Tensor aout = make(dev, dt, std::vector<float>(size_t(n * blk), -99.0f));
          c.all_to_all(ain, aout)->wait();
          const auto av = testing::tensor_values(dev, aout);
          for (int r = 0; r < n; ++r)
            for (int64_t j = 0; j < blk; ++j) BOOST_TEST(av[size_t(r * blk + j)] == value(r, me * blk + j, 8, dt));
          res.add(dev, "all_to_all " + tag, aout);
        }
      }
    }
  }
  // Host scalars (fp64), chunked like the rest.
  for (int64_t len : kFlatSizes) {
    std::vector<double> h(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) h[size_t(i)] = double(value(me, i, 9, DType::kF32));
    c.all_reduce_host(h.data(), int(len), ReduceOp::kSum);
    for (int64_t i = 0; i < len; ++i) {
      double want = 0;
      for (int r = 0; r < n; ++r) want += double(value(r, i, 9, DType::kF32));
      BOOST_TEST(h[size_t(i)] == want);
    }
    res.names.push_back("all_reduce_host size " + std::to_string(len));
    const auto* p = reinterpret_cast<const uint8_t*>(h.data());
    res.bytes.emplace_back(p, p + h.size() * sizeof(double));
  }
  return res;
}

// Runs every operation with the default limit, then with each small limit, and compares.
void compare_limits(Communicator& c, Device& dev) {
  DefaultLimitAtExit restore;
  BOOST_REQUIRE(mpi_max_count() == kMpiDefaultMaxCount);
  const auto before = c.bytes_sent();
  const Results reference = run_all(c, dev);
  auto per_run = c.bytes_sent();
  for (int k = 0; k < int(CollectiveKind::kCount); ++k) per_run[size_t(k)] -= before[size_t(k)];
  for (int64_t limit : {3, 5, 7, 1}) {
    BOOST_TEST_CONTEXT("chunk limit " << limit) {
      set_mpi_max_count_for_testing(limit);
      BOOST_REQUIRE(mpi_max_count() == limit);
      const auto start = c.bytes_sent();
      const Results chunked = run_all(c, dev);
      BOOST_REQUIRE(chunked.names == reference.names);
      for (size_t i = 0; i < reference.bytes.size(); ++i)
        BOOST_TEST_CONTEXT(reference.names[i]) { BOOST_TEST(chunked.bytes[i] == reference.bytes[i]); }
      // Chunking changes no byte counter: they count the logical operation once.
      for (int k = 0; k < int(CollectiveKind::kCount); ++k)
        BOOST_TEST(c.bytes_sent()[size_t(k)] - start[size_t(k)] == per_run[size_t(k)]);
      set_mpi_max_count_for_testing(kMpiDefaultMaxCount);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(chunk_plans_past_int_max) {
  const int64_t two31 = int64_t(1) << 31;
  BOOST_TEST(kMpiDefaultMaxCount % kMpiChunkAlign == 0);
  BOOST_TEST(kMpiDefaultMaxCount <= INT_MAX);
  BOOST_TEST(kMpiDefaultMaxCount > int64_t(INT_MAX) - kMpiChunkAlign);

  // 2^31 + 5 elements: one full chunk and the rest.
  auto p = plan_mpi_chunks(two31 + 5, kMpiDefaultMaxCount);
  BOOST_TEST_REQUIRE(p.size() == 2u);
  BOOST_TEST(p[0].count == int(kMpiDefaultMaxCount));
  BOOST_TEST(p[1].offset == kMpiDefaultMaxCount);
  BOOST_TEST(int64_t(p[1].count) == two31 + 5 - kMpiDefaultMaxCount);
  check_tiling(p, two31 + 5, kMpiDefaultMaxCount);

  // 3 · 2^31 elements: three full chunks of the aligned default and 3 · 4096 elements left.
  p = plan_mpi_chunks(3 * two31, kMpiDefaultMaxCount);
  BOOST_TEST_REQUIRE(p.size() == 4u);
  BOOST_TEST(p[3].count == 3 * int(kMpiChunkAlign));
  for (const MpiChunk& c : p) BOOST_TEST(c.offset % kMpiChunkAlign == 0);  // chunks stay aligned
  check_tiling(p, 3 * two31, kMpiDefaultMaxCount);

  // The same with the unaligned maximum, INT_MAX: four chunks, 3 elements in the last.
  p = plan_mpi_chunks(3 * two31, INT_MAX);
  BOOST_TEST_REQUIRE(p.size() == 4u);
  BOOST_TEST(p[3].count == 3);
  check_tiling(p, 3 * two31, INT_MAX);

  // Exactly INT_MAX fits one call; one more does not.
  BOOST_TEST(plan_mpi_chunks(INT_MAX, INT_MAX).size() == 1u);
  BOOST_TEST(plan_mpi_chunks(int64_t(INT_MAX) + 1, INT_MAX).size() == 2u);

  // Small limits, as the MPI tests use them; an empty transfer is one empty call.
  p = plan_mpi_chunks(7, 3);
  BOOST_TEST_REQUIRE(p.size() == 3u);
  BOOST_TEST(p[2].offset == 6);
  BOOST_TEST(p[2].count == 1);
  BOOST_TEST(plan_mpi_chunks(6, 3).size() == 2u);
  p = plan_mpi_chunks(0, 3);
  BOOST_TEST_REQUIRE(p.size() == 1u);
  BOOST_TEST(p[0].offset == 0);
  BOOST_TEST(p[0].count == 0);

  BOOST_CHECK_THROW(plan_mpi_chunks(-1, 3), std::invalid_argument);
  BOOST_CHECK_THROW(plan_mpi_chunks(5, 0), std::invalid_argument);
  BOOST_CHECK_THROW(plan_mpi_chunks(5, int64_t(INT_MAX) + 1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(per_rank_limits) {
  // ranks × block stays within the limit, aligned when large, at least one element when small.
  for (int ranks : {1, 2, 3, 7, 64, 1000}) {
    const int64_t b = per_rank_max_count(kMpiDefaultMaxCount, ranks);
    BOOST_TEST(b * ranks <= kMpiDefaultMaxCount);
    BOOST_TEST(b % kMpiChunkAlign == 0);
    BOOST_TEST(b + kMpiChunkAlign > kMpiDefaultMaxCount / ranks);
  }
  BOOST_TEST(per_rank_max_count(kMpiDefaultMaxCount, 3) == 715825152);
  BOOST_TEST(per_rank_max_count(7, 2) == 3);
  BOOST_TEST(per_rank_max_count(5, 3) == 1);
  BOOST_TEST(per_rank_max_count(2, 3) == 1);
  BOOST_TEST(per_rank_max_count(INT_MAX, 1) == int64_t(INT_MAX) / kMpiChunkAlign * kMpiChunkAlign);
  BOOST_CHECK_THROW(per_rank_max_count(5, 0), std::invalid_argument);
  BOOST_CHECK_THROW(per_rank_max_count(0, 2), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(limit_setting_and_checked_counts) {
  DefaultLimitAtExit restore;
  BOOST_TEST(mpi_max_count() == kMpiDefaultMaxCount);
  BOOST_CHECK_THROW(set_mpi_max_count_for_testing(0), std::invalid_argument);
  BOOST_CHECK_THROW(set_mpi_max_count_for_testing(int64_t(INT_MAX) + 1), std::invalid_argument);
  BOOST_TEST(mpi_max_count() == kMpiDefaultMaxCount);  // a rejected value changes nothing
  set_mpi_max_count_for_testing(INT_MAX);
  BOOST_TEST(mpi_max_count() == INT_MAX);

  BOOST_TEST(checked_int_count(0, "x") == 0);
  BOOST_TEST(checked_int_count(INT_MAX, "x") == INT_MAX);
  BOOST_CHECK_THROW(checked_int_count(int64_t(INT_MAX) + 1, "x"), CommError);
  BOOST_CHECK_THROW(checked_int_count(-1, "x"), std::invalid_argument);
  try {
    checked_int_count(int64_t(1) << 32, "checksum records");
    BOOST_FAIL("no error");
  } catch (const CommError& e) {
    BOOST_TEST(std::string(e.what()) ==
               "checksum records: 4294967296 elements exceed the MPI int count limit (2147483647)");
  }
}

BOOST_AUTO_TEST_CASE(mpi_chunked_equals_unchunked) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  BOOST_REQUIRE_GE(world.size(), 2);
  auto dev = make_device("cpu", 1);  // host memory: the MpiCommunicator's tensors
  compare_limits(world, *dev);
}

BOOST_AUTO_TEST_CASE(staged_chunked_equals_unchunked) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto dev = make_device("cpu", 1);
  StagedCommunicator staged(world, *dev);
  compare_limits(staged, *dev);
}

// A sub-communicator (2 of the ranks, or 1 when there are 2) chunks with its own rank count.
BOOST_AUTO_TEST_CASE(split_communicator_chunked) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto sub = world.split(world.rank() == 0 ? 0 : 1, world.rank(), "rest");
  auto dev = make_device("cpu", 1);
  compare_limits(*sub, *dev);
}
