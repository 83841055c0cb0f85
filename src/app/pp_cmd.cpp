// `meshtrain pp schedule --schedule NAME --pp N --microbatches M [--stages-per-rank V |
// --layers L --layers-per-stage K [--first-stage-less-layers A] [--last-stage-less-layers B]]`
// or `meshtrain pp schedule --csv FILE [--stages-per-rank V] [--placement loop|v]`: generates
// (or reads) and checks a pipeline schedule, prints its unit-cost timeline, simulated bubble
// next to the papers' formula, and peak in-flight micro-batches per rank; with --layers, the
// stage split of the blocks as a deck with those keys gets it. Serial; no MPI launch.
#include <charconv>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/schedule_csv.hpp"
#include "parallel/pipeline/simulate.hpp"
#include "parallel/pipeline/stage_split.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

namespace {

const char* kUsage =
    "usage: meshtrain pp schedule --schedule NAME --pp N --microbatches M "
    "[--stages-per-rank V | --layers L --layers-per-stage K [--first-stage-less-layers A] "
    "[--last-stage-less-layers B]]\n"
    "       meshtrain pp schedule --csv FILE [--stages-per-rank V] [--placement loop|v]";

int to_int(const std::string& flag, const std::string& text) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 1)
    throw ConfigError("meshtrain pp schedule: " + flag + " '" + text + "' is not a positive integer");
  return v;
}

std::string placement_text(const PipelineSchedule& s) {
  if (s.placement == StagePlacement::kV) return "V placement: rank r holds stages r and " + std::to_string(2 * s.pp - 1) + " - r";
  if (s.stages_per_rank == 1) return "rank r holds stage r";
  std::string t = "loop placement: rank r holds stages r";
  for (int c = 1; c < s.stages_per_rank; ++c) t += ", r + " + std::to_string(c * s.pp);
  return t;
}

void print_schedule(const PipelineSchedule& s, bool with_formula) {
  const SimulationResult r = simulate_schedule(s);
  std::printf("schedule %s: pp %d, %d stage%s per rank (%s), %d micro-batches\n", s.name.c_str(), s.pp,
              s.stages_per_rank, s.stages_per_rank == 1 ? "" : "s", placement_text(s).c_str(), s.microbatches);
  std::printf("unit costs: F = 1, B = 2, I = 1, W = 1, communication free; cells are {stage}{F|B|I|W}{micro-batch}\n\n");
  std::fputs(format_timeline(r).c_str(), stdout);
  std::printf("\nmakespan %lld units; bubble fraction (max over ranks of idle / busy): simulated %.4f",
              static_cast<long long>(r.makespan), r.bubble_fraction());
  if (with_formula) {
    const BubbleFormula f = textbook_bubble(s);
    std::printf(", %s = %.4f", f.text.c_str(), f.value);
  }
  std::printf("\npeak in-flight micro-batches per rank (forwards whose B, or W when split, has not run; per stage):");
  for (int p : r.peak_in_flight) std::printf(" %d", p);
  std::printf("\n");
}

int print_csv_schedule(std::map<std::string, std::string>& opt) {
  if (opt.count("--schedule") || opt.count("--pp") || opt.count("--microbatches") || opt.count("--layers"))
    throw ConfigError("meshtrain pp schedule: --csv takes pp and micro-batches from the file\n" + std::string(kUsage));
  const std::string placement = opt.count("--placement") ? opt["--placement"] : "loop";
  if (placement != "loop" && placement != "v")
    throw ConfigError("meshtrain pp schedule: --placement '" + placement + "' must be loop or v");
  const int v = opt.count("--stages-per-rank") ? to_int("--stages-per-rank", opt["--stages-per-rank"])
                                               : (placement == "v" ? 2 : 1);
  try {
    print_schedule(read_schedule_csv(opt["--csv"], v, placement == "v" ? StagePlacement::kV : StagePlacement::kLoop),
                   false);
  } catch (const ScheduleError& e) {
    throw ConfigError(e.what());
  }
  return kExitOk;
}

}  // namespace

int cmd_pp(int argc, char** argv) {
  if (argc < 1 || std::string(argv[0]) != "schedule") throw ConfigError(kUsage);
  std::map<std::string, std::string> opt;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag != "--schedule" && flag != "--pp" && flag != "--microbatches" && flag != "--stages-per-rank" &&
        flag != "--layers" && flag != "--layers-per-stage" && flag != "--csv" && flag != "--placement" &&
        flag != "--first-stage-less-layers" && flag != "--last-stage-less-layers")
      throw ConfigError("meshtrain pp schedule: unknown option '" + flag + "'\n" + kUsage);
    if (i + 1 >= argc) throw ConfigError("meshtrain pp schedule: " + flag + " needs a value\n" + kUsage);
    opt[flag] = argv[i + 1];
  }
  if (opt.count("--csv")) return print_csv_schedule(opt);
  if (!opt.count("--schedule") || !opt.count("--pp") || !opt.count("--microbatches")) throw ConfigError(kUsage);
  const std::string name = opt["--schedule"];
  const int pp = to_int("--pp", opt["--pp"]);
  const int m = to_int("--microbatches", opt["--microbatches"]);
  int v = 1;
  try {
    v = is_multi_stage(name) ? 2 : 1;
  } catch (const ScheduleError& e) {
    throw ConfigError(e.what());
  }
  if (opt.count("--stages-per-rank")) v = to_int("--stages-per-rank", opt["--stages-per-rank"]);
  if (opt.count("--layers-per-stage") != opt.count("--layers"))
    throw ConfigError("meshtrain pp schedule: --layers-per-stage and --layers go together\n" + std::string(kUsage));
  std::vector<StageLayers> split;
  if (opt.count("--layers-per-stage")) {
    if (opt.count("--stages-per-rank"))
      throw ConfigError("meshtrain pp schedule: give --stages-per-rank or --layers/--layers-per-stage, not both");
    const int layers = to_int("--layers", opt["--layers"]);
    const int per_stage = to_int("--layers-per-stage", opt["--layers-per-stage"]);
    auto weight = [&](const std::string& flag) {  // TorchTitan's default weight is 1; 0 is allowed
      if (!opt.count(flag)) return int64_t(1);
      return opt[flag] == "0" ? int64_t(0) : int64_t(to_int(flag, opt[flag]));
    };
    const int64_t first = weight("--first-stage-less-layers"), last = weight("--last-stage-less-layers");
    try {
      v = stages_per_rank_for(name, pp, layers, per_stage, first, last);
      split = split_stages(pp * v, layers, first, last);
    } catch (const ScheduleError& e) {
      throw ConfigError(e.what());
    }
  } else if (opt.count("--first-stage-less-layers") || opt.count("--last-stage-less-layers")) {
    throw ConfigError("meshtrain pp schedule: --first/--last-stage-less-layers need --layers and --layers-per-stage");
  }
  PipelineSchedule s;
  try {
    s = make_schedule(name, pp, m, v);
  } catch (const ScheduleError& e) {
    throw ConfigError(e.what());
  }
  print_schedule(s, true);
  if (!split.empty()) {
    std::printf("stages (TorchTitan's split of the layers, the embedding and the output weighing the _less_layers "
                "values):\n");
    for (int r = 0; r < pp; ++r) {
      std::printf("  rank %d:", r);
      for (int st : s.stages_of(r)) std::printf(" stage %d (%s)", st, describe(split[size_t(st)]).c_str());
      std::printf("\n");
    }
  }
  return kExitOk;
}

}  // namespace meshtrain::app
