#include "parallel/pipeline/stage_split.hpp"

#include <algorithm>

#include "parallel/pipeline/schedule.hpp"

namespace meshtrain {

namespace {
const char* kLayersKey = "[parallelism] pipeline_parallel_layers_per_stage";
}

int stages_per_rank_for(const std::string& schedule, int pp, int64_t n_layers, int64_t layers_per_stage,
                        int64_t first_less, int64_t last_less) {
  const bool multi = is_multi_stage(schedule);
  if (layers_per_stage <= 0) return multi ? 2 : 1;
  const int64_t effective = n_layers + first_less + last_less;
  const int64_t stages = (effective + layers_per_stage - 1) / layers_per_stage;
  const std::string what = std::to_string(n_layers) + " layers + " + std::to_string(first_less) + " + " +
                           std::to_string(last_less) + " for the embedding and the output give " +
                           std::to_string(stages) + " stages of at most " + std::to_string(layers_per_stage);
  if (stages % pp != 0)
    throw ScheduleError(std::string(kLayersKey) + " = " + std::to_string(layers_per_stage) + ": " + what +
                        ", which does not divide by pipeline_parallel_degree " + std::to_string(pp));
  const int v = int(stages / pp);
  if (!multi && v != 1)
    throw ScheduleError(std::string(kLayersKey) + " = " + std::to_string(layers_per_stage) + ": " + what + ", " +
                        std::to_string(v) + " per rank, but " + schedule + " runs one stage per rank");
  if (multi && v < 2)
    throw ScheduleError(std::string(kLayersKey) + " = " + std::to_string(layers_per_stage) + ": " + what +
                        ", one per rank, but " + schedule + " needs at least two stages per rank");
  if (schedule == "ZBVZeroBubble" && v != 2)
    throw ScheduleError(std::string(kLayersKey) + " = " + std::to_string(layers_per_stage) + ": " + what + ", " +
                        std::to_string(v) + " per rank, but ZBVZeroBubble runs exactly two stages per rank");
  return v;
}

std::vector<StageLayers> split_stages(int num_stages, int64_t n_layers, int64_t first_less, int64_t last_less) {
  if (first_less < 0 || last_less < 0)
    throw ScheduleError("[parallelism] pipeline_parallel_first_stage_less_layers and _last_stage_less_layers must be "
                        ">= 0");
  if (num_stages < 1) throw ScheduleError("[parallelism] pipeline_parallel_degree: at least one stage");
  std::vector<StageLayers> out(static_cast<size_t>(num_stages));
  if (num_stages == 1) {
    out[0] = {0, n_layers, true, true};
    return out;
  }
  const int64_t effective = n_layers + first_less + last_less;
  if (num_stages > effective)
    throw ScheduleError("[parallelism] pipeline_parallel_degree: " + std::to_string(num_stages) +
                        " stages for " + std::to_string(effective) + " effective layers (" + std::to_string(n_layers) +
                        " blocks + embedding + output); each stage needs at least one");
  const int64_t per = effective / num_stages, extra = effective % num_stages;
  if (first_less > per)
    throw ScheduleError("[parallelism] pipeline_parallel_first_stage_less_layers = " + std::to_string(first_less) +
                        " exceeds the " + std::to_string(per) + " layers of the smallest stage");
  if (last_less > per)
    throw ScheduleError("[parallelism] pipeline_parallel_last_stage_less_layers = " + std::to_string(last_less) +
                        " exceeds the " + std::to_string(per) + " layers of the smallest stage");
  int64_t next = 0;
  for (int s = 0; s < num_stages; ++s) {
    int64_t share = per + (s < extra ? 1 : 0);
    StageLayers& st = out[size_t(s)];
    st.embedding = s == 0;
    st.head = s + 1 == num_stages;
    if (st.embedding) share -= first_less;
    if (st.head) share -= last_less;
    st.first_layer = next;
    st.num_layers = std::min(share, n_layers - next);
    next += st.num_layers;
    if (st.num_layers == 0 && !st.embedding && !st.head)
      throw ScheduleError("[parallelism] pipeline_parallel_degree: stage " + std::to_string(s) +
                          " would hold no layer (" + std::to_string(num_stages) + " stages for " +
                          std::to_string(n_layers) + " blocks)");
  }
  return out;
}

std::string describe(const StageLayers& s) {
  std::string out;
  if (s.embedding) out = "embedding";
  if (s.num_layers > 0) {
    if (!out.empty()) out += " + ";
    out += s.num_layers == 1 ? "layer " + std::to_string(s.first_layer)
                             : "layers " + std::to_string(s.first_layer) + "-" +
                                   std::to_string(s.first_layer + s.num_layers - 1);
  }
  if (s.head) out += out.empty() ? "norm/output" : " + norm/output";
  return out;
}

}  // namespace meshtrain
