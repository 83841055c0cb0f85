#include "config/pipeline_plan.hpp"

#include <array>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "config/option_registry.hpp"
#include "parallel/pipeline/schedule_csv.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

const char* kCsvKey = "parallelism.pipeline_parallel_schedule_csv";

std::string str(int64_t v) { return std::to_string(v); }

// validate()'s message form: `ORIGIN: [section] key: what`, ORIGIN being where the key was set.
[[noreturn]] void fail(const JobConfig& c, const std::string& dotted, const std::string& what) {
  throw ConfigError(c.origin_of(dotted) + ": " + key_label(dotted) + what);
}

// The pipeline module's errors start with the deck key they are about ("[parallelism] key: ..."
// or "[parallelism] key = value: ..."); the user needs to know where that key was set.
[[noreturn]] void rethrow(const JobConfig& c, const ScheduleError& e) {
  const std::string msg = e.what(), section = "[parallelism] ";
  if (msg.rfind(section, 0) == 0) {
    const size_t end = msg.find_first_of(" :=", section.size());
    const std::string dotted = "parallelism." + msg.substr(section.size(), end - section.size());
    if (find_option(dotted)) throw ConfigError(c.origin_of(dotted) + ": " + msg);
  }
  fail(c, "parallelism.pipeline_parallel_degree", msg);
}

// pipeline_parallel_schedule_csv's lists for the deck's stages per rank `v`, pp and m: the
// placement still follows pipeline_parallel_schedule, as TorchTitan's pipeline_module_split
// places stages by the schedule name whether or not a CSV file replaces its actions.
PipelineSchedule csv_schedule(const JobConfig& c, int pp, int v, int m) {
  const std::string& path = c.parallelism.pipeline_parallel_schedule_csv;
  const std::string& name = c.parallelism.pipeline_parallel_schedule;
  const std::string deck = "the deck gives pp " + str(pp) + " × " + str(v) + " stage" + (v == 1 ? "" : "s") +
                           " per rank (" + name + ") = " + str(pp * v) + " stages and " + str(m) +
                           " micro-batches per round (local_batch_size / pipeline_parallel_microbatch_size)";
  if (!std::filesystem::is_regular_file(path)) fail(c, kCsvKey, "'" + path + "' does not exist or is not a file");
  // make_schedule()'s placement: only ZB-V folds its stages into a V.
  const StagePlacement placement = name == "ZBVZeroBubble" ? StagePlacement::kV : StagePlacement::kLoop;
  PipelineSchedule s;
  try {
    s = read_schedule_csv(path, v, placement);
  } catch (const ScheduleError& e) {
    fail(c, kCsvKey, std::string(e.what()) + " (" + deck + ")");
  }
  if (s.pp != pp) fail(c, kCsvKey, path + " has " + str(s.pp) + " rank lines, but " + deck);
  if (s.microbatches != m)
    fail(c, kCsvKey, path + " schedules " + str(s.microbatches) + " micro-batches, but " + deck);
  return s;
}

// make_schedule() per (name, pp, m, v), or its error: generating and validating a schedule
// costs far more than the rest of validate(), and `meshtrain plan` validates thousands of
// configurations sharing a few schedules. The schedule is immutable once made.
std::shared_ptr<const PipelineSchedule> cached_schedule(const std::string& name, int pp, int m, int v) {
  // The last schedule found on this thread, asked again without formatting the key (the
  // planner validates candidates of one schedule in runs).
  struct Last {
    std::string name;
    std::array<int, 3> sizes{};
    std::shared_ptr<const PipelineSchedule> made;
  };
  thread_local Last last;
  if (last.made && last.sizes == std::array<int, 3>{pp, m, v} && last.name == name) return last.made;
  static std::mutex mu;
  static std::map<std::string, std::pair<std::shared_ptr<const PipelineSchedule>, std::string>> memo;
  const std::string key = name + "/" + str(pp) + "/" + str(m) + "/" + str(v);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = memo.find(key);
    if (it != memo.end()) {
      if (!it->second.first) throw ScheduleError(it->second.second);
      last = {name, {pp, m, v}, it->second.first};
      return it->second.first;
    }
  }
  std::shared_ptr<const PipelineSchedule> made;
  std::string error;
  try {
    made = std::make_shared<const PipelineSchedule>(make_schedule(name, pp, m, v));
  } catch (const ScheduleError& e) {
    error = e.what();
  }
  std::lock_guard<std::mutex> lock(mu);
  memo.emplace(key, std::make_pair(made, error));
  if (!made) throw ScheduleError(error);
  return made;
}

}  // namespace

bool schedule_verdict(const std::string& name, int pp, int m, int v, std::string* why) {
  try {
    cached_schedule(name, pp, m, v);
    return true;
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::vector<StageLayers> JobConfig::pipeline_stages(const ParallelDims& d) const {
  const int64_t n_layers = model_layers();
  const ParallelismSection& p = parallelism;
  const int64_t first = p.pipeline_parallel_first_stage_less_layers, last = p.pipeline_parallel_last_stage_less_layers;
  if (d.pp == 1) return split_stages(1, n_layers, first, last);  // TorchTitan ignores the pp keys here
  try {
    const int v = stages_per_rank_for(p.pipeline_parallel_schedule, int(d.pp), n_layers,
                                      p.pipeline_parallel_layers_per_stage.value_or(0), first, last);
    // The last split made on this thread: validate() asks twice per configuration, and the
    // planner a million times for a few hundred splits (errors are not remembered).
    thread_local std::array<int64_t, 4> last_key{-1, -1, -1, -1};
    thread_local std::vector<StageLayers> last_split;
    const std::array<int64_t, 4> key = {int64_t(d.pp) * v, n_layers, first, last};
    if (key != last_key) {
      last_key = {-1, -1, -1, -1};
      last_split = split_stages(int(d.pp) * v, n_layers, first, last);
      last_key = key;
    }
    return last_split;
  } catch (const ScheduleError& e) {
    rethrow(*this, e);
  }
}

std::string describe_stage_placement(const PipelinePlan& plan) {
  std::string out;
  for (int r = 0; r < int(plan.schedule.ranks.size()); ++r) {
    out += "  pp rank " + std::to_string(r) + ":";
    for (int s : plan.schedule.stages_of(r)) out += " stage " + std::to_string(s) + " (" + describe(plan.stages[size_t(s)]) + ")";
    out += "\n";
  }
  return out;
}

PipelinePlan JobConfig::pipeline_plan(const ParallelDims& d) const { return pipeline_plan(d, true); }

PipelinePlan JobConfig::pipeline_plan(const ParallelDims& d, bool with_schedule) const {
  PipelinePlan plan;
  const int64_t local = training.local_batch_size;
  if (d.pp == 1) {  // no pipeline: the whole local batch is one micro-batch of the one stage
    plan.stages = pipeline_stages(d);
    plan.microbatch_size = local;
    return plan;
  }
  const int64_t mbs = parallelism.pipeline_parallel_microbatch_size;
  if (local % mbs)
    fail(*this, "parallelism.pipeline_parallel_microbatch_size",
         str(mbs) + " does not divide [training] local_batch_size " + str(local) +
             " (micro-batches per round = local_batch_size / pipeline_parallel_microbatch_size)");
  plan.microbatch_size = mbs;
  plan.microbatches = local / mbs;
  plan.stages = pipeline_stages(d);
  const int pp = int(d.pp), v = int(plan.stages.size()) / pp, m = int(plan.microbatches);
  if (!parallelism.pipeline_parallel_schedule_csv.empty()) {
    plan.schedule = csv_schedule(*this, pp, v, m);
    return plan;
  }
  try {
    const std::shared_ptr<const PipelineSchedule> s = cached_schedule(parallelism.pipeline_parallel_schedule, pp, m, v);
    if (with_schedule) plan.schedule = *s;
  } catch (const ScheduleError& e) {
    rethrow(*this, e);
  }
  return plan;
}

}  // namespace meshtrain
