#pragma once
/// @file MetricsWriter: metrics.jsonl, one JSON object per line (DESIGN.md, run outputs), written
/// by rank 0 and flushed per record so a killed job keeps every logged step.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace meshtrain {

class MetricsWriter {
 public:
  /// Opens `path` when `enabled` (rank 0; otherwise every call is a no-op): truncated for a new
  /// run, appended to when `append` (a run resumed from a checkpoint keeps its history).
  /// @throws std::runtime_error naming the file when it cannot be opened.
  MetricsWriter(const std::string& path, bool enabled, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  FILE* f_ = nullptr;
};

}  // namespace meshtrain
