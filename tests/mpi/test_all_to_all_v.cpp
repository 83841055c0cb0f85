// Communicator::all_to_all_v (the token exchange of expert parallelism) on 4 ranks, against a
// serial computation every rank does from the rank numbers alone: uneven splits, empty blocks
// (to itself, to others, a rank sending nothing at all), rows of several widths and dtypes, over
// MpiCommunicator and StagedCommunicator (CpuDevice), with the bytes counted for other ranks.
#define BOOST_TEST_MODULE all_to_all_v
#include <boost/test/unit_test.hpp>

#include <vector>

#include "comm/staged_communicator.hpp"
#include "device/device.hpp"
#include "mpi/mpi_fixture.hpp"
#include "tensor_values.hpp"

using namespace meshtrain;
using meshtrain::testing::MpiFixture;

BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

// Rows rank s sends to rank d: uneven, with zeros — rank 1 sends nothing, nobody sends to
// rank 2 except itself, rank 3 keeps nothing.
int64_t rows_from_to(int s, int d) {
  if (s == 1) return 0;
  if (d == 2) return s == 2 ? 3 : 0;
  if (s == 3 && d == 3) return 0;
  return 1 + (s * 3 + d * 5) % 4;
}

// Element c of row r of the block rank s sends to rank d: integers below 256, exact in bf16.
float value(int s, int d, int64_t r, int64_t c) { return float((37 * s + 11 * d + 5 * r + c) % 251); }

void check(Communicator& c, Device& dev, int64_t width, DType dt) {
  const int me = c.rank(), n = c.size();
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  std::vector<float> in;
  for (int d = 0; d < n; ++d) {
    send[size_t(d)] = rows_from_to(me, d);
    recv[size_t(d)] = rows_from_to(d, me);
    for (int64_t r = 0; r < send[size_t(d)]; ++r)
      for (int64_t x = 0; x < width; ++x) in.push_back(value(me, d, r, x));
  }
  std::vector<float> want;
  for (int s = 0; s < n; ++s)
    for (int64_t r = 0; r < recv[size_t(s)]; ++r)
      for (int64_t x = 0; x < width; ++x) want.push_back(value(s, me, r, x));
  const auto shape = [&](int64_t rows) { return width == 1 ? Shape{rows} : Shape{rows, width}; };
  Tensor tin = dev.empty(shape(int64_t(in.size()) / width), dt, MemCategory::kCommunication);
  Tensor tout = dev.empty(shape(int64_t(want.size()) / width), dt, MemCategory::kCommunication);
  testing::set_tensor_values(dev, tin, in);
  const int64_t before = c.bytes_sent()[int(CollectiveKind::kAllToAll)];
  c.all_to_all_v(tin, send, tout, recv)->wait();
  BOOST_TEST(testing::tensor_values(dev, tout) == want, boost::test_tools::per_element());
  int64_t bytes = 0;
  for (int d = 0; d < n; ++d)
    if (d != me) bytes += send[size_t(d)] * width * int64_t(dtype_size(dt));
  BOOST_TEST(c.bytes_sent()[int(CollectiveKind::kAllToAll)] - before == bytes);
}

}  // namespace

BOOST_AUTO_TEST_CASE(uneven_and_empty_splits_match_the_serial_exchange) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  BOOST_REQUIRE_EQUAL(world.size(), 4);
  auto dev = make_device("cpu", 1);
  StagedCommunicator staged(world, *dev);
  for (int64_t width : {1, 3, 64})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      BOOST_TEST_CONTEXT("width " << width << " " << dtype_name(dt)) {
        check(world, *dev, width, dt);
        check(staged, *dev, width, dt);
      }
    }
}

BOOST_AUTO_TEST_CASE(bad_counts_are_refused_before_any_transfer) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto dev = make_device("cpu", 1);
  Tensor t = dev->empty({4, 2}, DType::kF32, MemCategory::kCommunication);
  const std::vector<int64_t> four = {1, 1, 1, 1};
  BOOST_CHECK_THROW(world.all_to_all_v(t, {1, 1, 2}, t, four), std::invalid_argument);        // 3 counts
  BOOST_CHECK_THROW(world.all_to_all_v(t, {1, 1, 1, 2}, t, four), std::invalid_argument);     // 5 rows != 4
  BOOST_CHECK_THROW(world.all_to_all_v(t, {2, 2, 1, -1}, t, four), std::invalid_argument);    // negative
  Tensor other = dev->empty({4, 3}, DType::kF32, MemCategory::kCommunication);
  BOOST_CHECK_THROW(world.all_to_all_v(t, four, other, four), std::invalid_argument);         // row width
}
