#pragma once
/// @file The pipeline plan of a deck: what JobConfig::pipeline_plan() derives from the
/// [parallelism] pipeline_parallel_* keys at validation, so that a pp deck that cannot run fails
/// before any work with one error naming its key, and the trainer reads one checked value.
///
/// Rules, in the order they are checked (TorchTitan v0.2.2, torchtitan/distributed/
/// pipeline_parallel.py, and parallel/pipeline/schedule.hpp):
///  1. local_batch_size % pipeline_parallel_microbatch_size == 0; m = the quotient, the
///     micro-batches of one pipeline round (build_pipeline_schedule's n_microbatches);
///  2. stages per rank from the schedule name and pipeline_parallel_layers_per_stage, and the
///     split of the blocks over pp × that many stages (stage_split.hpp, pipeline_llm's rule);
///  3. without a CSV file: the schedule's rules (check_schedule_rules(): 1F1B needs m ≥ pp, ...)
///     and the generated lists (make_schedule(), validated);
///     with pipeline_parallel_schedule_csv: the file must exist (TorchTitan raises
///     FileNotFoundError), parse and validate for the deck's stages per rank and placement, and
///     hold pp rank lines and m micro-batches. The generator's rules on m do not apply: TorchTitan
///     runs a CSV through _PipelineScheduleRuntime, which has none.
#include <cstdint>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/stage_split.hpp"

namespace meshtrain {

/// One deck's pipeline: the same on every rank of a run (each rank runs schedule.ranks[its pp
/// coordinate]). Invariants: microbatch_size × microbatches == local_batch_size, and
/// stages.size() == schedule.num_stages().
struct PipelinePlan {
  /// Every pp rank's action list, generated (schedule.name = pipeline_parallel_schedule) or read
  /// from the CSV file (schedule.name = "csv"), validated; empty ranks when pp == 1.
  PipelineSchedule schedule;
  /// [num_stages] the blocks, embedding and head of each stage, stage 0 first.
  std::vector<StageLayers> stages;
  int64_t microbatch_size = 1;  ///< samples per micro-batch
  int64_t microbatches = 1;     ///< m, micro-batches per pipeline round
};

/// Whether make_schedule(name, pp, m, v) succeeds (its rules and the generated lists' checks),
/// memoized per process — the verdict JobConfig::pipeline_plan() reaches for a generated
/// schedule. `why` receives the error otherwise. Throws nothing.
bool schedule_verdict(const std::string& name, int pp, int m, int v, std::string* why = nullptr);

/// Lines naming every pp rank's stages and their layers, one per pp rank:
/// "  pp rank 0: stage 0 (embedding + layers 0-2) stage 2 (layers 6-8)" — what the start-up log
/// and `meshtrain layout` print. Empty when the plan has no schedule (pp = 1). Throws nothing.
std::string describe_stage_placement(const PipelinePlan& plan);

}  // namespace meshtrain
