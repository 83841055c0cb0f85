#include "parallel/pipeline/schedule_csv.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace meshtrain {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

PipelineSchedule parse_schedule_csv(const std::string& text, const std::string& source, int stages_per_rank,
                                    StagePlacement placement) {
  PipelineSchedule s;
  s.name = "csv";
  s.stages_per_rank = stages_per_rank;
  s.placement = placement;
  bool has_comm = false;
  int max_mb = -1;
  std::istringstream in(text);
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    const std::string row = trim(line);
    if (row.empty() || row[0] == '#') continue;
    std::vector<Action> list;
    std::istringstream cells(row);
    for (std::string cell; std::getline(cells, cell, ',');) {
      cell = trim(cell);
      if (cell.empty()) continue;
      try {
        list.push_back(parse_action(cell));
      } catch (const ScheduleError& e) {
        throw ScheduleError(source + ":" + std::to_string(lineno) + ": rank " + std::to_string(s.ranks.size()) + ": " +
                            e.what());
      }
      has_comm = has_comm || !list.back().is_compute();
      max_mb = std::max(max_mb, list.back().microbatch);
    }
    s.ranks.push_back(std::move(list));
  }
  if (s.ranks.empty()) throw ScheduleError(source + ": no rank lines (expected one line of actions per rank)");
  if (placement == StagePlacement::kV && stages_per_rank != 2)
    throw ScheduleError(source + ": V placement holds exactly 2 stages per rank, got " + std::to_string(stages_per_rank));
  if (stages_per_rank < 1) throw ScheduleError(source + ": needs at least 1 stage per rank");
  s.pp = static_cast<int>(s.ranks.size());
  s.microbatches = max_mb + 1;
  if (s.microbatches < 1) throw ScheduleError(source + ": no actions");
  if (!has_comm) insert_communication(s);
  try {
    validate_schedule(s);
  } catch (const ScheduleError& e) {
    throw ScheduleError(source + ": " + e.what());
  }
  return s;
}

PipelineSchedule read_schedule_csv(const std::string& path, int stages_per_rank, StagePlacement placement) {
  std::ifstream f(path);
  if (!f) throw ScheduleError(path + ": cannot read the schedule CSV");
  std::stringstream buf;
  buf << f.rdbuf();
  return parse_schedule_csv(buf.str(), path, stages_per_rank, placement);
}

std::string write_schedule_csv(const PipelineSchedule& s, bool with_communication) {
  std::string out;
  for (const auto& list : s.ranks) {
    std::string row;
    for (const Action& a : list)
      if (with_communication || a.is_compute()) {
        if (!row.empty()) row += ',';
        row += to_string(a);
      }
    out += row + '\n';
  }
  return out;
}

}  // namespace meshtrain
