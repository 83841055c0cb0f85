#define BOOST_TEST_MODULE node_read
// NodeReader on 3 ranks of one node: every rank's scattered byte ranges of one file land exactly,
// whatever the planning window — one window, a few, or hundreds of odd-sized ones, so the
// reading thread runs on from each window into the next one planned ahead — with pieces from one
// byte to hundreds of KiB, pieces shared by several ranks, pieces crossing window edges, and a
// rank that wants nothing. The reading rank's observer sees every byte it read once, in file
// order, as the file holds it. Both transfers: mapped (every rank copies its bytes out of its own
// mapping of the file) and sent (the reader reads them into its ring and sends them). A file that
// cannot be opened, or ends before the size the caller gave, is reported on the reading rank, and
// the other ranks get zeros where the bytes could not be read, not a crash.
#include <boost/test/unit_test.hpp>

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/node_read.hpp"
#include "mpi/mpi_fixture.hpp"
#include "util/errors.hpp"

using namespace meshtrain;

using testing::MpiFixture;
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

constexpr uint64_t kFileBytes = (uint64_t(3) << 20) + 12345;

char byte_at(uint64_t i) { return char((i * 2654435761u) >> 13); }

int rank_of_world() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A file of kFileBytes known bytes, written by rank 0, in a folder named after rank 0's pid.
std::string shared_file() {
  int pid = int(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() / ("meshtrain_test_node_read_" + std::to_string(pid));
  const std::string path = (dir / "data.bin").string();
  if (rank_of_world() == 0) {
    std::filesystem::create_directories(dir);
    std::string bytes(kFileBytes, '\0');
    for (uint64_t i = 0; i < kFileBytes; ++i) bytes[i] = byte_at(i);
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// This rank's wanted ranges: random, non-overlapping, 1 byte to 300 KiB, in random order; ranks 0
// and 1 also want one range in common; rank 2 wants nothing when `idle_rank2`.
std::vector<std::pair<uint64_t, uint64_t>> wanted(int rank, bool idle_rank2) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  if (rank == 2 && idle_rank2) return out;
  std::mt19937_64 rng(1000 + uint64_t(rank));
  for (uint64_t at = rng() % 5000; at < kFileBytes;) {
    const uint64_t kind = rng() % 4;
    const uint64_t n = std::min<uint64_t>(kFileBytes - at, kind == 0 ? 1 + rng() % 16 : kind == 1 ? 1 + rng() % 4096
                                                                                         : 1 + rng() % (300 << 10));
    out.emplace_back(at, n);
    at += n + rng() % (kind == 3 ? (2 << 20) : 70000);
  }
  if (rank <= 1) out.emplace_back(kFileBytes - 100000, 100000);  // the same bytes on two ranks
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  for (size_t i = 1; i < out.size(); ++i)  // the shared range may overlap a random one: trim
    if (out[i].first < out[i - 1].first + out[i - 1].second) {
      const uint64_t end = out[i].first + out[i].second;
      out[i - 1].second = out[i].first - out[i - 1].first;
      if (end < out[i - 1].first + out[i - 1].second) out[i].second = out[i - 1].first + out[i - 1].second - out[i].first;
    }
  std::erase_if(out, [](const auto& r) { return r.second == 0; });
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

void read_and_check(uint64_t window, bool idle_rank2, NodeReader::Transfer transfer) {
  const int rank = rank_of_world();
  const std::string path = shared_file();
  const auto ranges = wanted(rank, idle_rank2);
  uint64_t total = 0;
  for (const auto& [o, n] : ranges) total += n;
  std::vector<char> dst(total + 1, '\x7f');
  std::vector<FileExtent> extents;
  for (uint64_t at = 0; const auto& [o, n] : ranges) extents.push_back({o, n, dst.data() + at}), at += n;
  NodeReader reader(MPI_COMM_WORLD, window, transfer);
  uint64_t seen_end = 0, seen_bytes = 0;
  bool in_order = true, as_in_file = true;
  const uint64_t disk = reader.read(path, kFileBytes, extents, [&](uint64_t off, const char* data, uint64_t n) {
    in_order &= off >= seen_end;
    seen_end = off + n;
    seen_bytes += n;
    for (uint64_t i = 0; i < n; ++i) as_in_file &= data[i] == byte_at(off + i);
  });
  BOOST_TEST(in_order);
  BOOST_TEST(as_in_file);
  if (reader.reader()) BOOST_TEST(disk == seen_bytes);
  else BOOST_TEST(disk == 0u);
  bool exact = true;
  for (uint64_t at = 0; const auto& [o, n] : ranges) {
    for (uint64_t i = 0; i < n; ++i) exact &= dst[at + i] == byte_at(o + i);
    at += n;
  }
  BOOST_TEST(exact);
  BOOST_TEST(dst.back() == '\x7f');  // nothing written past the wanted bytes
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

}  // namespace

constexpr auto kMapped = NodeReader::Transfer::kMapped;
constexpr auto kSent = NodeReader::Transfer::kSent;

BOOST_AUTO_TEST_CASE(one_window) { read_and_check(NodeReader::kDefaultWindow, false, kMapped); }
BOOST_AUTO_TEST_CASE(a_few_windows) { read_and_check(uint64_t(1) << 20, false, kMapped); }
BOOST_AUTO_TEST_CASE(hundreds_of_odd_windows) { read_and_check(12347, false, kMapped); }
BOOST_AUTO_TEST_CASE(a_rank_wanting_nothing) { read_and_check(65536 + 7, true, kMapped); }
BOOST_AUTO_TEST_CASE(sent_one_window) { read_and_check(NodeReader::kDefaultWindow, false, kSent); }
BOOST_AUTO_TEST_CASE(sent_a_few_windows) { read_and_check(uint64_t(1) << 20, false, kSent); }
BOOST_AUTO_TEST_CASE(sent_hundreds_of_odd_windows) { read_and_check(12347, false, kSent); }
BOOST_AUTO_TEST_CASE(sent_a_rank_wanting_nothing) { read_and_check(65536 + 7, true, kSent); }

BOOST_AUTO_TEST_CASE(missing_file_reported_on_the_reader) {
  for (const auto transfer : {kMapped, kSent}) {
    std::vector<char> dst(64);
    NodeReader reader(MPI_COMM_WORLD, 4096, transfer);
    const std::vector<FileExtent> extents{{100, 64, dst.data()}};
    const std::string path = "/nonexistent/meshtrain_test_node_read.bin";
    if (reader.reader()) {
      BOOST_CHECK_EXCEPTION(reader.read(path, 10000, extents), CheckpointError,
                            [&](const CheckpointError& e) { return std::string(e.what()).find(path) != std::string::npos; });
    } else {
      BOOST_CHECK_NO_THROW(reader.read(path, 10000, extents));
    }
  }
}

// The caller's size says the file goes on 40,000 bytes past its end (a file that shrank): the
// reader reports the short file by name; every rank's bytes before the end land, the wanted bytes
// past it are zeros, and no rank touches a page past the end (SIGBUS in the mapped transfer).
BOOST_AUTO_TEST_CASE(file_shorter_than_its_size_reported_on_the_reader) {
  const std::string path = shared_file();
  const int rank = rank_of_world();
  for (const auto transfer : {kMapped, kSent}) {
    // Each rank: 1,000 bytes well before the end, and 500 bytes past it (+ 8,192 + 1,000 rank).
    std::vector<char> dst(1500, '\x7f');
    const uint64_t before = 4096 * uint64_t(rank + 1), past = kFileBytes + 8192 + 1000 * uint64_t(rank);
    const std::vector<FileExtent> extents{{before, 1000, dst.data()}, {past, 500, dst.data() + 1000}};
    NodeReader reader(MPI_COMM_WORLD, 1 << 20, transfer);
    if (reader.reader()) {
      BOOST_CHECK_EXCEPTION(reader.read(path, kFileBytes + 40000, extents), CheckpointError, [&](const CheckpointError& e) {
        return std::string(e.what()).find(path) != std::string::npos &&
               std::string(e.what()).find("end of file") != std::string::npos;
      });
    } else {
      BOOST_CHECK_NO_THROW(reader.read(path, kFileBytes + 40000, extents));
      bool landed = true, zeros = true;
      for (uint64_t i = 0; i < 1000; ++i) landed &= dst[i] == byte_at(before + i);
      for (uint64_t i = 1000; i < 1500; ++i) zeros &= dst[i] == 0;
      BOOST_TEST(landed);
      BOOST_TEST(zeros);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}
