#pragma once
/// @file TensorBoardWriter: scalars as a TensorBoard event file ([metrics] enable_tensorboard),
/// readable by `tensorboard --logdir` and by validation/read_tfevents.py.
///
/// The file is a sequence of TFRecords (metrics/tfrecord.hpp), each an Event protocol buffer
/// (metrics/tensorboard_event.proto: TensorBoard's event.proto / summary.proto field numbers):
/// first {wall_time, step 0, file_version "brain.Event:2"}, then one Event per add_scalars() call
/// {wall_time, step, summary {value {tag, simple_value}...}}. simple_value is a float: doubles
/// are rounded to float32, as TensorBoard's own writers do.
///
/// Every writer creates a new file — TensorBoard's name pattern
/// `events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<rank>` (".1", ".2", ... appended
/// if that name exists) — and never truncates or appends to an old one: a resumed run adds a file
/// next to the previous run's, and TensorBoard merges the files of a folder by step.
#include <cstdio>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain {

class TensorBoardWriter {
 public:
  /// Creates `folder` (and parents) and a new event file in it, and writes the file_version
  /// record. `wall_time` (Unix seconds; < 0: now) names the file and stamps that record.
  /// @throws std::runtime_error naming the folder or file when it cannot be created or written.
  TensorBoardWriter(const std::string& folder, int rank, double wall_time = -1);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// Appends one Event holding every (tag, value) of step `step`, stamped `wall_time` (Unix
  /// seconds; < 0: now), and flushes it to the operating system so a killed job keeps it.
  /// @throws std::invalid_argument for an empty tag; std::runtime_error naming the file on a
  /// write error.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars, double wall_time = -1);

  /// The event file's path.
  const std::string& path() const { return path_; }

  /// Seconds since the Unix epoch (the system clock), as Event.wall_time holds them.
  static double now();

 private:
  void write_record(const std::string& event_bytes);
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace meshtrain
