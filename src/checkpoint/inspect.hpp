#pragma once
/// @file `meshtrain ckpt inspect`: a readable account of a checkpoint file.
#include <string>

namespace meshtrain {

/// The report of checkpoint `path`: format and version, train state (step, tokens seen, loader
/// cursor, optimizer step), the writer's layout, world size and model, every dataset with its
/// shape and dtype, and the checksum verdict (every listed shard re-read and hashed, serially).
/// `ok` is set to whether every checksum matched. @throws CheckpointError naming the file when
/// it cannot be opened or is not a meshtrain checkpoint.
std::string inspect_checkpoint(const std::string& path, bool& ok);

}  // namespace meshtrain
