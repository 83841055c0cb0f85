// Writes what a run with [metrics] enable_tensorboard leaves behind, for ctest
// tensorboard_events_decode (tests/unit/check_tfevents.py): DIR/tb with two event files (a run
// logging steps 1-3, then a resumed run re-running step 3 and logging 4-5) and DIR/metrics.jsonl
// with the same scalars as training records, plus a validation record and a summary line.
// Values are not float32-representable, and step 2's grad_norm is NaN (null in the jsonl).
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "metrics/metrics_writer.hpp"
#include "metrics/tensorboard_writer.hpp"

using namespace meshtrain;

namespace {

double loss(int64_t s) { return 10.0 / (1.0 + 0.37 * double(s)) + 1e-9 * double(s); }
double grad_norm(int64_t s) {
  return s == 2 ? std::numeric_limits<double>::quiet_NaN() : 1.2345678901234 * double(s);
}
double lr(int64_t s) { return 3e-4 * double(s) / 7.0; }

void log_step(TensorBoardWriter& tb, MetricsWriter& jsonl, int64_t s) {
  tb.add_scalars(s, {{"loss", loss(s)}, {"grad_norm", grad_norm(s)}, {"lr", lr(s)}});
  jsonl.write({{"step", s}, {"loss", loss(s)}, {"grad_norm", grad_norm(s)}, {"lr", lr(s)}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_tfevents DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  MetricsWriter jsonl(dir + "/metrics.jsonl", true);
  {
    TensorBoardWriter first(dir + "/tb", 0, 1700000000);
    for (int64_t s = 1; s <= 3; ++s) log_step(first, jsonl, s);
  }
  TensorBoardWriter resumed(dir + "/tb", 0, 1700000100);
  for (int64_t s = 3; s <= 5; ++s) log_step(resumed, jsonl, s);
  jsonl.write({{"step", 5}, {"val_loss", 3.25}});
  jsonl.write({{"event", "summary"}, {"final_loss", loss(5)}});
  return 0;
}
