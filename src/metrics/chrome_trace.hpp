#pragma once
/// @file Chrome trace JSON of one rank's recorded spans (util/trace.hpp), the format Perfetto
/// (ui.perfetto.dev) and chrome://tracing open. Format: Google's "Trace Event Format" document
/// (JSON Object Format):
///
///     {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
///
/// with, for a rank R,
///  - metadata ("ph": "M") events: "process_name" {"name": "rank R"} and "process_sort_index"
///    {"sort_index": R} for pid R, and "thread_name" {"name": ...} for every tid that appears;
///  - one complete ("ph": "X") event per trace::Span: name, cat, pid = R, tid = the OS thread
///    id, ts = start and dur = duration in microseconds (fractional, nanosecond resolution),
///    args = the span's args;
///  - one nestable async begin/end pair ("ph": "b" / "e", the same "id" and "cat") per async
///    event (a collective from issue to its first observed completion), so intervals that
///    overlap the thread's spans without nesting get rows of their own;
///  - otherData: {"rank", "step", "origin_unix_us" (the system clock at ts = 0, to align ranks),
///    "dropped_events", "generator": "meshtrain"}.
/// Events are sorted by start time, the longer first on ties, so parents precede children.
///
/// Files follow TorchTitan's layout: `<folder>/iteration_<step>/rank<R>_trace.json`, one per
/// rank per traced window, where step is the last step of the window.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "util/trace.hpp"

namespace meshtrain {

/// The trace document of `rec` for rank `rank` (pid), traced window ending at `step`. Throws nothing.
nlohmann::json chrome_trace_json(const trace::Recording& rec, int rank, int64_t step);

/// `<folder>/iteration_<step>/rank<rank>_trace.json`. Throws nothing.
std::string chrome_trace_path(const std::string& folder, int64_t step, int rank);

/// Writes chrome_trace_json(rec, rank, step) to chrome_trace_path(folder, step, rank), creating
/// the folders, atomically: into `<path>.tmp.<pid>`, then renamed, so a viewer or a killed job
/// never sees half a file. Returns the path.
/// @throws std::runtime_error naming the folder or file when it cannot be created or written.
std::string write_chrome_trace(const std::string& folder, int64_t step, int rank, const trace::Recording& rec);

}  // namespace meshtrain
