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
#include "tensorboard_event.pb.h"

namespace meshtrain {

namespace {

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

  tensorboard::Event first;
  first.set_wall_time(wall_time);
  first.set_step(0);
  first.set_file_version("brain.Event:2");  // the version TensorBoard's readers expect
  write_record(first.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                                    double wall_time) {
  tensorboard::Event ev;
  ev.set_wall_time(wall_time < 0 ? now() : wall_time);
  ev.set_step(step);
  tensorboard::Summary* summary = ev.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    if (tag.empty()) throw std::invalid_argument(path_ + ": a TensorBoard scalar needs a non-empty tag");
    tensorboard::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(float(value));
  }
  write_record(ev.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& event_bytes) {
  const std::string rec = tfrecord_frame(event_bytes);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    throw std::runtime_error(path_ + ": write failed (" + std::strerror(errno) + ")");
}

}  // namespace meshtrain
