#pragma once
/// @file The checkpoint folder: step-NNNNNNNN.h5 files, the `latest` pointer, atomic publication
/// and pruning (doc/checkpoint-format.md). A save never damages the previous checkpoint: the new
/// file is written as step-NNNNNNNN.h5.tmp, flushed and fsync'ed, and only then renamed into place
/// and pointed to by `latest` (itself replaced by rename).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain {

/// "step-00000042.h5" for step 42.
std::string checkpoint_file_name(int64_t step);

/// The checkpoint to resume from in `folder`: step `load_step` when ≥ 0 (an error if absent),
/// else the one `latest` names, else none (a fresh run). @throws CheckpointError naming the
/// folder or file: a requested step that does not exist, a `latest` that names a missing file.
std::optional<std::string> checkpoint_to_load(const std::string& folder, int64_t load_step);

/// Steps of the complete step-NNNNNNNN.h5 files in `folder`, ascending (none when it does not exist).
std::vector<int64_t> checkpoint_steps(const std::string& folder);

/// Rank 0's part of publishing a written `tmp` file (…/step-N.h5.tmp): fsync it, rename it to
/// its final name, replace `latest` atomically, then delete the oldest step files beyond
/// `keep_latest_k` (0 keeps all). @throws CheckpointError naming the file on an I/O failure
/// (the previous checkpoint and pointer are then untouched).
void publish_checkpoint(const std::string& folder, int64_t step, int64_t keep_latest_k);

/// Rank 0's part of publishing a single written file (model_final.h5): fsync `tmp`, rename it
/// to `final_path`, fsync the folder. A reader sees the old file or the complete new one, never
/// a partial one. @throws CheckpointError naming the file on an I/O failure.
void publish_file(const std::string& tmp, const std::string& final_path);

}  // namespace meshtrain
