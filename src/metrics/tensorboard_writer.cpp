#include "metrics/tensorboard_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "metrics/tfrecord.hpp"

namespace meshtrain {

namespace {

// The two messages are encoded here in the protocol-buffer wire format (the "Encoding" page of
// the Protocol Buffers documentation), field by field as protoc's generated code would for
// metrics/tensorboard_event.proto (proto3: field-number order, zero scalars omitted, oneof members
// always written), instead of linking libprotobuf: Debian's libsentencepiece.so.0, which the same
// binary loads for `data prepare`, carries its own protobuf-lite and exports its symbols, so
// generated code linked against libprotobuf-lite 3.21 ends up calling SentencePiece's older copy
// (a crash in MessageLite::SerializeAsString). tests/unit/check_tfevents.py decodes the files with
// python3-protobuf and checks every record re-serializes to the same bytes.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

enum Wire { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_key(std::string& out, int field, Wire wire) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire)); }

void put_little_endian(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char(uint8_t(bits >> (8 * i))));
}

void put_bytes(std::string& out, int field, const std::string& s) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, s.size());
  out += s;
}

// Event {wall_time = 1 (double), step = 2 (int64), oneof {file_version = 3, summary = 5}}.
std::string event_bytes(double wall_time, int64_t step, const std::string* file_version, const std::string* summary) {
  std::string out;
  if (wall_time != 0.0) {
    uint64_t bits;
    std::memcpy(&bits, &wall_time, sizeof bits);
    put_key(out, 1, kFixed64);
    put_little_endian(out, bits, 8);
  }
  if (step != 0) {
    put_key(out, 2, kVarint);
    put_varint(out, uint64_t(step));  // int64: two's complement, 10 bytes when negative
  }
  if (file_version) put_bytes(out, 3, *file_version);
  if (summary) put_bytes(out, 5, *summary);
  return out;
}

// Summary {repeated Value value = 1}; Value {tag = 1 (string), oneof {simple_value = 2 (float)}}.
void add_summary_value(std::string& summary, const std::string& tag, float value) {
  std::string v;
  if (!tag.empty()) put_bytes(v, 1, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(v, 2, kFixed32);
  put_little_endian(v, bits, 4);
  put_bytes(summary, 1, v);
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// Opens a file that did not exist (O_EXCL), so an existing event file is never truncated.
FILE* create_new(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  FILE* f = ::fdopen(fd, "wb");
  if (!f) ::close(fd);
  return f;
}

}  // namespace

double TensorBoardWriter::now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder, int rank, double wall_time) {
  if (wall_time < 0) wall_time = now();
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw std::runtime_error(folder + ": cannot create the TensorBoard folder (" + ec.message() + ")");

  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%010lld", static_cast<long long>(std::floor(wall_time)));
  const std::string base = (std::filesystem::path(folder) / ("events.out.tfevents." + std::string(seconds) + "." +
                                                             hostname() + "." + std::to_string(::getpid()) + "." +
                                                             std::to_string(rank)))
                               .string();
  // Two writers of one process and rank within one second (tests) get suffixes instead of
  // sharing a file.
  for (int n = 0; n < 1000 && !f_; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    f_ = create_new(path_);
    if (!f_ && errno != EEXIST)
      throw std::runtime_error(path_ + ": cannot create the event file (" + std::strerror(errno) + ")");
  }
  if (!f_) throw std::runtime_error(base + ": cannot create the event file (1000 files of this name exist)");

  const std::string version = "brain.Event:2";  // the version TensorBoard's readers expect
  write_record(event_bytes(wall_time, 0, &version, nullptr));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                                    double wall_time) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    if (tag.empty()) throw std::invalid_argument(path_ + ": a TensorBoard scalar needs a non-empty tag");
    add_summary_value(summary, tag, float(value));
  }
  write_record(event_bytes(wall_time < 0 ? now() : wall_time, step, nullptr, &summary));
}

void TensorBoardWriter::write_record(const std::string& event_bytes) {
  const std::string rec = tfrecord_frame(event_bytes);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    throw std::runtime_error(path_ + ": write failed (" + std::strerror(errno) + ")");
}

}  // namespace meshtrain
