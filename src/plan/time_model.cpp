#include "plan/time_model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "graph/executor.hpp"
#include "layout/comm_volume.hpp"
#include "parallel/pipeline/simulate.hpp"

namespace meshtrain {

namespace {

double ring(int64_t n) { return n > 1 ? double(n - 1) / double(n) : 0.0; }

}  // namespace

StepTimePrediction predict_step_time(const JobConfig& cfg, const ParallelDims& d, const PipelinePlan* plan,
                                     const std::vector<RankState>& states, const ActivationPrediction& act,
                                     const HardwareSpec& hw, const std::vector<RankPlace>& places,
                                     const ModelArgs* given) {
  const ModelArgs a = given ? *given : cfg.model_args();
  const bool bf16 = cfg.training.mixed_precision_param == "bfloat16";
  const double beta = bf16 ? 2 : 4, rb = cfg.training.mixed_precision_reduce == "bfloat16" ? 2 : 4;
  const double peak = hw.peak_flops(bf16 ? 2 : 4);
  if (peak <= 0) throw std::invalid_argument("hardware " + hw.name + " has no " + (bf16 ? "bf16" : "fp32") + " peak");
  const bool cpu_backend = hw.peak_bf16_flops == 0;
  const int64_t world = d.world();
  const double seq = double(cfg.training.seq_len);
  const double global_tokens = double(cfg.global_batch(d)) * seq;
  const double t_replica = global_tokens / double(d.dp() * d.cp);  // tokens a dp × cp replica runs
  const int64_t accum = cfg.grad_accum_steps(d);
  const int64_t micro = d.pp > 1 && plan ? accum * plan->microbatches : accum;  // micro-batches per step

  // ---- compute ----
  const CheckpointPolicy ac =
      CheckpointPolicy::from_deck(cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option);
  double recompute_fraction = 0;  // of the blocks, whose forward runs twice
  for (int64_t b = 0; b < a.n_layers; ++b) recompute_fraction += ac.recompute(b) ? 1.0 / double(a.n_layers) : 0.0;
  const double attn_per_block = 0.5 * 12.0 * double(a.n_heads) * double(a.head_dim) * seq;  // causal half
  double mm = 0, attn = 0;  // FLOPs per token of the busiest pipeline rank
  for (const RankState& st : states) {
    double m_r = st.head ? 6.0 * double(a.dim) * double(a.vocab_size) : 0.0, a_r = 0;
    for (size_t i = 0; i < st.blocks.size(); ++i) {
      const double rec = ac.recompute(st.blocks[i]) ? 1.0 : 0.0;
      m_r += (6.0 + 2.0 * rec) * st.block_params[i];
      a_r += attn_per_block * (1.0 + rec / 3.0);
    }
    if (m_r / hw.matmul_efficiency + a_r / hw.attention_efficiency >
        mm / hw.matmul_efficiency + attn / hw.attention_efficiency)
      mm = m_r, attn = a_r;
  }
  mm *= t_replica / double(d.tp);
  attn *= t_replica / double(d.tp);
  int64_t local_params = 0;
  for (const RankState& st : states) local_params = std::max(local_params, d.dp_shard * d.cp > 1 ? st.shard : st.flat);
  // Memory-bound kernels: the activations a micro-batch keeps, each written in forward, read in
  // backward, its gradient written and read, ~6 passes, at memory_efficiency; the optimizer's
  // multi-tensor AdamW streams 28 bytes per local element at the full bandwidth.
  const double traffic = 6.0 * double(act.per_microbatch_rank) * double(micro);
  const double optimizer_bytes = 28.0 * double(local_params);
  // The pipeline bubble, as a fraction of compute: the schedule's textbook figure (a CSV
  // schedule: simulated).
  const bool pipelined = d.pp > 1;
  double bubble_fraction = 0;
  if (pipelined && plan) {
    try {
      bubble_fraction = textbook_bubble(plan->schedule).value;
    } catch (const std::exception&) {
      bubble_fraction = simulate_schedule(plan->schedule).bubble_fraction();
    }
  }
  // CPU ranks of one node share its memory bandwidth (the cpu entry's is the node's: each busy
  // core gets its share), and ranks beyond its core count time-slice the cores. A pipeline rank
  // waiting in its bubble blocks in MPI and leaves its core (Open MPI yields when
  // oversubscribed): busy ranks are per_node / (1 + bubble).
  const int64_t per_node = cpu_backend ? std::min<int64_t>(world, std::max<int64_t>(cfg.topology.ranks_per_node, 1))
                                       : hw.devices_per_node;
  const double busy_ranks = double(per_node) / (1.0 + bubble_fraction);
  const double cores = double(hw.devices_per_node);
  const double bandwidth =
      cpu_backend ? hw.memory_bandwidth / std::max(1.0, std::min(busy_ranks, cores)) : hw.memory_bandwidth;
  StepTimePrediction p;
  p.compute_s = mm / (peak * hw.matmul_efficiency) + attn / (peak * hw.attention_efficiency) +
                traffic / (bandwidth * hw.memory_efficiency) + optimizer_bytes / bandwidth;
  if (cpu_backend && busy_ranks > cores) p.compute_s *= busy_ranks / cores;

  // ---- communication ----
  // Group spans: the mesh is laid out tp innermost, then cp, dp_shard, dp_replicate, pp; ep is
  // the innermost ranks of each fsdp group, efsdp the rest (layout/rank_layout.hpp).
  if (int64_t(places.size()) < world)
    throw std::invalid_argument("predict_step_time: " + std::to_string(places.size()) + " placed ranks for a world of " +
                                std::to_string(world));
  // The group of rank 0 spans ranks 0, stride, …, stride·(size − 1), consecutive blocks of the
  // mesh; the same holds for every group (the layout is homogeneous).
  auto tier = [&](int64_t stride, int64_t size) {
    const RankPlace &first = places[0], &last = places[size_t(stride * (size - 1))];
    return last.node == first.node ? "node" : last.rack == first.rack ? "rack" : "spine";
  };
  auto add = [&](const char* dim, int64_t stride, int64_t size, double bytes, double collectives) {
    if (size <= 1 || bytes <= 0) return;
    CommTime c;
    c.dim = dim;
    c.tier = tier(stride, size);
    const bool intra = std::string_view(c.tier) == "node";  // NVLink; rack and spine: the network
    const double bw = (intra ? hw.intra_node_bandwidth : hw.inter_node_bandwidth) * hw.comm_efficiency;
    const double lat = intra ? hw.intra_node_latency_s : hw.inter_node_latency_s;
    c.bytes = bytes;
    c.seconds = bytes / bw + collectives * double(size - 1) * lat;
    p.comm.push_back(c);
  };
  const auto vol = comm_bytes_per_step(cfg, d);
  const int64_t fsdp = d.dp_shard * d.cp, efsdp = fsdp / std::max<int64_t>(d.ep, 1);
  const RankState& st = *std::max_element(states.begin(), states.end(),
                                          [](const RankState& x, const RankState& y) { return x.shard < y.shard; });
  const double units = double(st.units.size());
  const int zero = fsdp > 1 ? int(cfg.parallelism.zero_stage) : 0;
  const double dense_shard = double(st.shard - st.shard_experts), expert_shard = double(st.shard_experts);
  auto fsdp_bytes = [&](double shard, int64_t g) {
    if (g <= 1) return 0.0;
    const double ag_once = shard * double(g - 1) * (zero == 3 && bf16 ? 2 : 4), rs_once = shard * double(g - 1) * rb;
    const double head = st.units.empty() ? 0 : double(st.units.back().gather) / double(g);
    const double resharded = std::max(0.0, shard - head) * double(g - 1) * (bf16 ? 2 : 4);
    const bool reshard = !pipelined && cfg.parallelism.fsdp_reshard_after_forward != "never";
    if (zero == 3)
      return pipelined ? ag_once + rs_once : double(accum) * (ag_once + (reshard ? resharded : 0) + rs_once);
    if (zero == 2) return ag_once + (pipelined ? 1.0 : double(accum)) * rs_once;
    return ag_once + rs_once;
  };
  add("fsdp", d.tp, fsdp, fsdp_bytes(dense_shard, fsdp), double(micro) * units * 3);
  if (d.ep > 1) add("efsdp", d.tp * d.ep, efsdp, fsdp_bytes(expert_shard, efsdp), double(micro) * units * 3);
  const double replicated = fsdp > 1 ? double(st.shard) : double(st.flat);
  add("dp_replicate", d.tp * fsdp, d.dp_replicate, 2 * rb * replicated * ring(d.dp_replicate), units);
  add("tp", 1, d.tp, vol[size_t(MeshDim::kTP)], double(micro) * (4.0 * double(a.n_layers) / double(d.pp) + 2));
  add("cp", d.tp, d.cp, vol[size_t(MeshDim::kCP)], double(micro) * double(a.n_layers) / double(d.pp) * 2);
  add("pp", d.tp * fsdp * d.dp_replicate, d.pp, vol[size_t(MeshDim::kPP)], double(micro) * 2);
  if (d.ep > 1 && a.num_experts > 0) {
    // Each MoE block exchanges its routed rows out and back in forward, and their gradients in
    // backward (and again when recomputed): 4 (+2) all-to-alls of R = n·top_k rows of D.
    int64_t moe_blocks = 0;
    for (int64_t b = 0; b < a.n_layers; ++b) moe_blocks += a.is_moe_layer(b) ? 1 : 0;
    const double tokens_mb = t_replica / double(micro);
    const double rows = tokens_mb / (cfg.parallelism.enable_sequence_parallel && d.tp > 1 ? double(d.tp) : 1.0) *
                        double(a.top_k);
    const double per = rows * double(a.dim) * beta * ring(d.ep);
    add("ep", d.tp, d.ep, double(micro) * double(moe_blocks) / double(d.pp) * (4 + 2 * recompute_fraction) * per,
        double(micro) * double(moe_blocks) / double(d.pp) * 4);
  }
  // Exposure (see the header).
  const double overlap = hw.comm_overlap * p.compute_s;
  double attention_s = attn / (peak * hw.attention_efficiency);
  if (cpu_backend && busy_ranks > cores) attention_s *= busy_ranks / cores;
  double hidden_budget = overlap;  // compute that async collectives may hide behind, shared
  for (CommTime& c : p.comm) {
    const std::string_view dim = c.dim;
    if (dim == "tp" || dim == "ep" || dim == "pp" ||
        (dim == "cp" && cfg.parallelism.context_parallel_rotate_method != "alltoall")) {
      c.exposed_s = c.seconds;
    } else if (dim == "cp") {
      c.exposed_s = std::max(0.0, c.seconds - attention_s);
    } else {
      const double first = units > 0 ? c.seconds / (units * double(micro)) : 0;  // the first gather shows
      const double hidden = std::min(hidden_budget, c.seconds - first);
      hidden_budget -= hidden;
      c.exposed_s = c.seconds - hidden;
    }
    p.exposed_comm_s += c.exposed_s;
  }
  p.bubble_s = bubble_fraction * p.compute_s;
  p.step_s = p.compute_s + p.exposed_comm_s + p.bubble_s;
  p.tokens_per_s_per_device = global_tokens / p.step_s / double(world);
  p.mfu = a.flops_per_token(cfg.training.seq_len) * global_tokens / (p.step_s * double(world) * peak);
  return p;
}

std::vector<RankPlace> placement_for(const JobConfig& cfg, int64_t world, const HardwareSpec& hw,
                                     const std::string& topology_file) {
  const bool cpu_backend = hw.peak_bf16_flops == 0;
  const int64_t per_node = cpu_backend ? std::min<int64_t>(world, std::max<int64_t>(cfg.topology.ranks_per_node, 1))
                                       : hw.devices_per_node;
  const Topology topo = topology_file.empty() ? Topology() : Topology::from_slurm_conf(topology_file);
  const std::vector<std::string> hosts =
      topo.empty() || int64_t(topo.hosts().size()) * per_node < world ? std::vector<std::string>{} : topo.hosts();
  return synthetic_places(world, per_node, cfg.topology.nodes_per_rack, topo, hosts);
}

}  // namespace meshtrain
