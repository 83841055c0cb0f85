#include "metrics/metrics_writer.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace meshtrain {

MetricsWriter::MetricsWriter(const std::string& path, bool enabled, bool append) {
  if (!enabled) return;
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) throw std::runtime_error(path + ": cannot open for writing (" + std::strerror(errno) + ")");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!f_) return;
  const std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
}

}  // namespace meshtrain
