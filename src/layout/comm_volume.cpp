#include "layout/comm_volume.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "config/toml_value.hpp"

namespace meshtrain {

namespace {
double dtype_bytes(const std::string& name) { return name == "bfloat16" ? 2.0 : 4.0; }
double ring(int64_t n) { return n > 1 ? double(n - 1) / double(n) : 0.0; }

std::string human(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
  return buf;
}
}  // namespace

std::array<double, kNumMeshDims> comm_bytes_per_step(const JobConfig& cfg, const ParallelDims& d) {
  std::array<double, kNumMeshDims> v{};
  const ModelArgs m = cfg.model_args();
  const double bp = dtype_bytes(cfg.training.mixed_precision_param), br = dtype_bytes(cfg.training.mixed_precision_reduce);
  const double a = double(cfg.grad_accum_steps(d));
  const double b = double(cfg.training.local_batch_size), s = double(cfg.training.seq_len) / double(d.cp);
  const double h = double(m.dim), layers = double(m.n_layers) / double(d.pp);
  const double p_stage = double(m.num_params()) / double(d.tp * d.pp);
  const int64_t fsdp = d.dp_shard * d.cp;
  const double act = b * s * h * bp;  // one activation tensor of a micro-batch
  v[size_t(MeshDim::kFSDP)] = fsdp > 1 ? a * (2 * bp + br) * p_stage * ring(fsdp) : 0;
  v[size_t(MeshDim::kDpReplicate)] = 2 * br * p_stage / double(fsdp) * ring(d.dp_replicate);
  // Reductions (or all-gather + reduce-scatter pairs) per micro-batch: 4 per block, 1 each for
  // the embedding and the output head (one of them on a boundary pipeline stage), 2 more per
  // block whose forward activation checkpointing recomputes in backward.
  const std::string& ac = cfg.activation_checkpoint.mode;
  const auto every = toml::parse_int(cfg.activation_checkpoint.selective_ac_option);
  const double recomputed = ac == "full"                           ? layers
                            : ac == "selective" && every && *every > 0 ? std::ceil(layers / double(*every))
                                                                   : 0.0;
  v[size_t(MeshDim::kTP)] = a * (4 * layers + (d.pp == 1 ? 2 : 1) + 2 * recomputed) * 2 * ring(d.tp) * act;
  v[size_t(MeshDim::kPP)] = d.pp > 1 ? a * 2 * act : 0;
  v[size_t(MeshDim::kCP)] = d.cp > 1 ? a * 3 * layers * double(d.cp - 1) * 2 * b * s * double(m.n_kv_heads * m.head_dim) * bp : 0;
  // dp_shard and cp traffic is the fsdp group's; loss and dp carry only scalars.
  return v;
}

std::string layout_report_with_volume(const RankLayout& l, const JobConfig& cfg) {
  const auto vol = comm_bytes_per_step(cfg, l.dims());
  std::istringstream in(layout_report(l));
  std::ostringstream out;
  std::string line;
  int row = -2;  // the first two lines are the summary and the header
  while (std::getline(in, line)) {
    if (row == -1) line += "   bytes/step/rank";
    if (row >= 0 && row < kNumMeshDims) {
      const double b = vol[size_t(row)];
      line += "   " + (b > 0 ? human(b) : std::string("-"));
    }
    out << line << "\n";
    ++row;
  }
  out << "bytes/step/rank: ring-algorithm volumes per optimizer step (doc/layout.md; ring all-reduce 2·S·(N−1)/N, all-gather / reduce-scatter S·(N−1)/N)\n";
  return out.str();
}

}  // namespace meshtrain
