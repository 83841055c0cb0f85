// CRC-32C, TFRecord framing and the TensorBoard event file (metrics/tfrecord.hpp,
// metrics/tensorboard_writer.hpp). The protobuf contents are decoded independently by
// validation/read_tfevents.py in ctest tensorboard_events_decode.
#define BOOST_TEST_MODULE tensorboard
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "metrics/tensorboard_writer.hpp"
#include "metrics/tfrecord.hpp"
#include "scratch_dir.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

fs::path tmp_dir(const std::string& name) {
  const fs::path d = meshtrain::testing::scratch_dir("meshtrain_test_tb") / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}

// Splits a TFRecord stream into its records' data, checking every length and CRC.
std::vector<std::string> unframe(const std::string& bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    BOOST_REQUIRE(bytes.size() - pos >= 16);
    const uint64_t n = le(bytes, pos, 8);
    BOOST_REQUIRE(le(bytes, pos + 8, 4) == masked_crc32c(std::string_view(bytes).substr(pos, 8)));
    BOOST_REQUIRE(pos + 12 + n + 4 <= bytes.size());
    const std::string data = bytes.substr(pos + 12, n);
    BOOST_REQUIRE(le(bytes, pos + 12 + n, 4) == masked_crc32c(data));
    out.push_back(data);
    pos += 12 + n + 4;
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(crc32c_test_vectors) {
  // The check value of the CRC-32C parameter set (Castagnoli) and RFC 3720 appendix B.4.
  BOOST_TEST(crc32c("123456789") == 0xE3069283u);
  BOOST_TEST(crc32c("") == 0u);
  BOOST_TEST(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  BOOST_TEST(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[size_t(i)] = char(i);
  BOOST_TEST(crc32c(ascending) == 0x46DD794Eu);
}

BOOST_AUTO_TEST_CASE(masked_crc_is_tensorflows_rotation_plus_delta) {
  const uint32_t c = 0xE3069283u;
  BOOST_TEST(masked_crc32c("123456789") == uint32_t(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

BOOST_AUTO_TEST_CASE(tfrecord_frame_layout) {
  // An embedded NUL is data, not a terminator.
  const std::string rec = tfrecord_frame(std::string_view("abc\0def", 7));
  BOOST_REQUIRE(rec.size() == 7u + 16u);
  BOOST_TEST(le(rec, 0, 8) == 7u);
  BOOST_TEST(le(rec, 8, 4) == masked_crc32c(std::string_view(rec).substr(0, 8)));
  BOOST_TEST(rec.substr(12, 7) == std::string("abc\0def", 7));
  BOOST_TEST(le(rec, 19, 4) == masked_crc32c(std::string_view("abc\0def", 7)));
  const std::string empty = tfrecord_frame("");
  BOOST_TEST(empty.size() == 16u);
  BOOST_TEST(le(empty, 12, 4) == masked_crc32c(""));
}

BOOST_AUTO_TEST_CASE(event_file_name_records_and_flushing) {
  const fs::path dir = tmp_dir("writer") / "tb";  // created by the writer
  TensorBoardWriter w(dir.string(), 2, 1700000000.25);
  const fs::path path = w.path();
  BOOST_TEST(path.parent_path() == dir);
  const std::regex pattern(R"(events\.out\.tfevents\.1700000000\.[^/]+\.)" + std::to_string(::getpid()) + R"(\.2)");
  BOOST_TEST(std::regex_match(path.filename().string(), pattern), path.filename().string());

  BOOST_TEST(unframe(read_file(path)).size() == 1u);  // the file_version record, already on disk
  w.add_scalars(1, {{"loss", 2.5}, {"lr", 1e-4}});
  BOOST_TEST(unframe(read_file(path)).size() == 2u);  // flushed per step, without closing
  w.add_scalars(2, {{"loss", 2.25}});
  const auto records = unframe(read_file(path));
  BOOST_REQUIRE(records.size() == 3u);
  // The scalars' tags are in the serialized Events (length-delimited strings).
  BOOST_TEST(records[0].find("brain.Event:2") != std::string::npos);
  BOOST_TEST(records[1].find("loss") != std::string::npos);
  BOOST_TEST(records[1].find("lr") != std::string::npos);
  BOOST_TEST(records[2].find("lr") == std::string::npos);
  BOOST_CHECK_THROW(w.add_scalars(3, {{"", 1.0}}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(a_second_writer_never_truncates_the_first_file) {
  const fs::path dir = tmp_dir("resume");
  std::string first_path, first_bytes;
  {
    TensorBoardWriter a(dir.string(), 0, 1700000000);
    a.add_scalars(1, {{"loss", 3.0}});
    first_path = a.path();
  }
  first_bytes = read_file(first_path);
  TensorBoardWriter b(dir.string(), 0, 1700000000);  // same second, process and rank: a suffix
  b.add_scalars(2, {{"loss", 2.0}});
  BOOST_TEST(b.path() != first_path);
  BOOST_TEST(b.path() == first_path + ".1");
  BOOST_TEST(read_file(first_path) == first_bytes);
  BOOST_TEST(unframe(read_file(b.path())).size() == 2u);
}

BOOST_AUTO_TEST_CASE(unwritable_folder_names_the_folder) {
  const fs::path file = tmp_dir("bad") / "a_file";
  std::ofstream(file) << "x";
  try {
    TensorBoardWriter w((file / "tb").string(), 0);
    BOOST_FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find((file / "tb").string()) != std::string::npos, e.what());
  }
}
