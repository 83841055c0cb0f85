#include "metrics/throughput.hpp"

namespace meshtrain {

Throughput compute_throughput(int64_t tokens, double step_time_s, int world_size, double flops_per_token,
                              double peak_flops) {
  Throughput t;
  if (step_time_s <= 0) return t;
  t.tokens_per_s = double(tokens) / step_time_s;
  t.tokens_per_s_per_rank = t.tokens_per_s / world_size;
  const double flops = flops_per_token * t.tokens_per_s_per_rank;
  t.tflops_per_rank = flops / 1e12;
  t.mfu = peak_flops > 0 ? flops / peak_flops : 0;
  return t;
}

}  // namespace meshtrain
