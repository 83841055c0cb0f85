#pragma once
/// @file How the model's layers are cut into pipeline stages, with TorchTitan's rule
/// (torchtitan.distributed.pipeline_parallel, v0.2.2): the embedding counts as
/// `first_stage_less_layers` layers and norm + output as `last_stage_less_layers`; the
/// effective layers n_layers + first + last are divided evenly over the stages and the first
/// stages take the remainder, one each. The number of stages is pp × stages-per-rank, where
/// stages-per-rank is 1 for single-stage schedules (GPipe, 1F1B) and 2 for the multi-stage ones,
/// unless `pipeline_parallel_layers_per_stage` sets it: ⌈effective layers / K⌉ stages in all.
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

/// One stage's share of the model: blocks [first_layer, first_layer + num_layers) (global
/// indices), plus the embedding (stage 0) or the norm + output head (the last stage).
struct StageLayers {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  bool embedding = false;
  bool head = false;
};

/// The number of stages per pp rank for `schedule` (a name of schedule_names(); a CSV schedule
/// takes it from the deck's pipeline_parallel_schedule, as in TorchTitan) under the rule above.
/// `layers_per_stage` ≤ 0 means unset. @throws ScheduleError naming
/// `[parallelism] pipeline_parallel_layers_per_stage` when the stage count does not divide by
/// pp, or gives a single-stage schedule more than one stage per rank, or a multi-stage one fewer
/// than two (ZBVZeroBubble: exactly two).
int stages_per_rank_for(const std::string& schedule, int pp, int64_t n_layers, int64_t layers_per_stage,
                        int64_t first_stage_less_layers, int64_t last_stage_less_layers);

/// Splits n_layers blocks over `num_stages` stages (the rule above; stage 0 holds the
/// embedding, the last stage the head). @throws ScheduleError naming
/// `[parallelism] pipeline_parallel_degree` (more stages than effective layers, or an empty
/// stage) or `pipeline_parallel_first_stage_less_layers` / `_last_stage_less_layers` (a weight
/// above the smallest stage's share), or for weights < 0.
std::vector<StageLayers> split_stages(int num_stages, int64_t n_layers, int64_t first_stage_less_layers,
                                      int64_t last_stage_less_layers);

/// "embedding + layers 0-2", "layers 3-5 + norm/output", "layers 4" …: a stage's content for
/// the start-up log and the layout report.
std::string describe(const StageLayers& s);

}  // namespace meshtrain
