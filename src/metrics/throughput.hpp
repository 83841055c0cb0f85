#pragma once
/// @file Throughput and model FLOPs utilization of one step.
#include <cstdint>

namespace meshtrain {

/// Rates of one optimizer step.
struct Throughput {
  double tokens_per_s = 0;          ///< global tokens / step time
  double tokens_per_s_per_rank = 0;
  double tflops_per_rank = 0;       ///< model FLOPs (flops_per_token · tokens/s per rank) / 1e12
  double mfu = 0;                   ///< achieved / peak FLOP/s per rank, in [0, 1]
};

/// tokens: global tokens in the step; flops_per_token from ModelArgs::flops_per_token (Kaplan
/// et al. 2020 with the attention term); peak_flops: per-rank peak FLOP/s (measured on CPU).
Throughput compute_throughput(int64_t tokens, double step_time_s, int world_size, double flops_per_token,
                              double peak_flops);

}  // namespace meshtrain
