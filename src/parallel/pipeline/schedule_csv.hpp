#pragma once
/// @file Pipeline schedules from and to CSV (TorchTitan's `[parallelism]
/// pipeline_parallel_schedule_csv`): the same per-rank action lists as the generators.
///
/// Format: one line per rank, line r holding rank r's actions in order, comma-separated, each in
/// PyTorch pipelining's action form `{stage}{F|B|I|W}{micro-batch}` (`0F3` = stage 0 forward of
/// micro-batch 3; `1B0`; `2I1`, `2W1` for a split backward) or a communication action
/// `{stage}{SEND_F|RECV_F|SEND_B|RECV_B}{micro-batch}`. Blanks around cells and empty cells are
/// ignored; a line starting with `#` is a comment. When a file has no communication action at
/// all, they are derived (insert_communication()); otherwise they are taken as written.
/// The number of ranks is the number of rank lines; micro-batches are 1 + the largest index.
#include <string>

#include "parallel/pipeline/schedule.hpp"

namespace meshtrain {

/// Parses `text` (the file's contents; `source` names it in errors) for pp = number of rank
/// lines, `stages_per_rank` stages per rank in `placement`, then validate_schedule()s it.
/// @throws ScheduleError as `SOURCE:LINE: ...` for a malformed action, or naming the rank and
///         action validate_schedule() rejects.
PipelineSchedule parse_schedule_csv(const std::string& text, const std::string& source, int stages_per_rank,
                                    StagePlacement placement);

/// Reads and parses the file at `path` (parse_schedule_csv()).
/// @throws ScheduleError when the file cannot be read, or as parse_schedule_csv().
PipelineSchedule read_schedule_csv(const std::string& path, int stages_per_rank, StagePlacement placement);

/// `s` in the format above; with `with_communication` false only compute actions are written.
std::string write_schedule_csv(const PipelineSchedule& s, bool with_communication);

}  // namespace meshtrain
