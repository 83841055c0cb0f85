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

/// Bytes a rank sends on the cp group per step (the cp term of comm_volume.hpp). `samples` =
/// micro-batches × samples per micro-batch: every term is linear in the samples, so pipeline
/// micro-batching (more, smaller micro-batches) does not change it. s = tokens per sample on the
/// rank, L = blocks per stage, C = blocks whose forward activation checkpointing reruns.
double cp_bytes(const std::string& rotate, const ParallelDims& d, const ModelArgs& m, double samples, double s,
                double L, double C, double bp) {
  if (d.cp <= 1) return 0.0;
  // dK/dV partial sums travel in f32 whatever the activation dtype: they are sums over ranks,
  // cast to the activation dtype once, after the last one arrives (cp_attention.cpp).
  constexpr double kGradBytes = 4;
  const double cp = double(d.cp), tp = double(d.tp), dh = double(m.head_dim);
  const double hq = double(m.n_heads) / tp, hkv = double(m.n_kv_heads) / tp;  // tp divides both (job_config)
  const double kv = 2 * samples * s * hkv * dh;  // K and V packed, as one collective moves them
  const double passes = 2 * L + C;                // forward, backward, recomputed forward
  if (rotate == "alltoall") return kv * (passes * (cp - 1) * bp + L * (cp - 1) * kGradBytes);
  if (rotate == "ulysses") return passes * 2 * ring(d.cp) * samples * s * (hq + hkv) * dh * bp;
  return kv * (cp - 1) * (passes * bp + L * kGradBytes);  // "allgather", the option table's only other value
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
  // selective_ac_option = "op" keeps attention and the reduce-scatters: each block reruns its
  // two all-gathers (half a pair each) under sequence parallelism, its two all-reduces without.
  const bool per_op = ac == "selective" && cfg.activation_checkpoint.selective_ac_option == "op";
  const double tp_rerun = per_op ? (cfg.parallelism.enable_sequence_parallel ? 1.0 : 2.0) * layers : 2 * recomputed;
  v[size_t(MeshDim::kTP)] = a * (4 * layers + (d.pp == 1 ? 2 : 1) + tp_rerun) * 2 * ring(d.tp) * act;
  v[size_t(MeshDim::kPP)] = d.pp > 1 ? a * 2 * act : 0;
  v[size_t(MeshDim::kCP)] = cp_bytes(cfg.parallelism.context_parallel_rotate_method, d, m, a * b, s, layers, recomputed, bp);
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
  const ParallelDims& d = l.dims();
  if (d.cp > 1) {  // how the cp line's bytes move: the rotate method and the chunks
    const std::string& m = cfg.parallelism.context_parallel_rotate_method;
    const char* how = m == "alltoall" ? "a ring of cp − 1 K/V hops per pass and cp − 1 hops of f32 dK/dV"
                      : m == "ulysses" ? "all-to-alls of q, k, v, the output and their gradients (heads split over cp)"
                                       : "K/V all-gathered per pass, f32 dK/dV reduce-scattered";
    out << "cp: " << m << " attention, " << how << "; each sample cut into " << 2 * d.cp << " chunks of "
        << cfg.training.seq_len / (2 * d.cp) << " tokens (" << cfg.parallelism.context_parallel_load_balancer
        << ")\n";
  }
  out << "bytes/step/rank: ring-algorithm volumes per optimizer step (doc/layout.md; ring all-reduce 2·S·(N−1)/N, all-gather / reduce-scatter S·(N−1)/N)\n";
  return out.str();
}

}  // namespace meshtrain
