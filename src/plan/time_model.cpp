#include "plan/time_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string_view>

#include "graph/executor.hpp"
#include "layout/comm_volume.hpp"
#include "parallel/pipeline/simulate.hpp"
#include "plan/document_mask.hpp"
#include "plan/muon_model.hpp"

namespace meshtrain {

namespace {

// Per-operator selective checkpointing (selective_ac_option = "op"): the share of a block's
// matmul parameters (so of its forward matmul FLOPs) whose matmuls run again in backward — of
// the counted linears wq, wk, wv, wo (w1, w3, w2) every second one, wk, wo (w3); in a MoE block
// also the router's gate and the routed experts (recomputed whole, active top_k experts).
double per_op_recomputed_share(const ModelArgs& a, bool moe) {
  const double d = double(a.dim), q = double(a.n_heads * a.head_dim), kv = double(a.n_kv_heads * a.head_dim);
  const double attn_all = d * (2 * q + 2 * kv), attn_rec = d * (kv + q);
  if (!moe) {
    const double f = double(a.ffn_dim());
    return (attn_rec + d * f) / (attn_all + 3 * d * f);
  }
  const double router = d * double(a.num_experts), routed = 3 * d * double(a.top_k * a.moe_inter_dim);
  const double shared = d * double(a.num_shared_experts * a.moe_inter_dim);
  return (attn_rec + router + routed + shared) / (attn_all + router + routed + 3 * shared);
}

// Async tensor parallelism (model/async_tensor_parallel.hpp): the share of a block's matmul
// parameters (so of its matmul FLOPs) inside the fused all-gather-matmul and matmul-reduce-scatter
// operators — attention's and the dense FFN's or the shared experts' linears; not the router or
// the routed experts, which keep the synchronous collectives.
double async_tp_fused_share(const ModelArgs& a, bool moe) {
  if (!moe) return 1.0;
  const double d = double(a.dim), q = double(a.n_heads * a.head_dim), kv = double(a.n_kv_heads * a.head_dim);
  const double attn = d * (2 * q + 2 * kv), shared = 3 * d * double(a.num_shared_experts * a.moe_inter_dim);
  const double router = d * double(a.num_experts), routed = 3 * d * double(a.top_k * a.moe_inter_dim);
  return (attn + shared) / (attn + shared + router + routed);
}

double ring(int64_t n) { return n > 1 ? double(n - 1) / double(n) : 0.0; }

// One linear layer's shape on a rank: `in` × `out` weights applied to `rows` rows.
struct Linear {
  double in, out, rows;
};

// Forward, input-gradient and weight-gradient GEMMs of `l` (each 2·rows·in·out FLOPs): the time
// they take, in units of FLOPs at the hardware's large-GEMM rate (FLOPs / shape efficiency).
double linear_effective_flops(const Linear& l, const HardwareSpec& hw) {
  const double f = 2.0 * l.rows * l.in * l.out;
  return f / gemm_shape_efficiency(l.rows, l.out, hw)     // Y[rows, out] = X·W
         + f / gemm_shape_efficiency(l.rows, l.in, hw)    // dX[rows, in] = dY·Wᵀ
         + f / gemm_shape_efficiency(l.in, l.out, hw);    // dW[in, out] = Xᵀ·dY
}

// The shape efficiency of a block's (or the head's) GEMMs together: Σ FLOPs / Σ FLOPs/efficiency
// over their forward, input-gradient and weight-gradient GEMMs (a FLOP-weighted harmonic mean).
double shape_efficiency(const std::vector<Linear>& ls, const HardwareSpec& hw) {
  double flops = 0, eff = 0;
  for (const Linear& l : ls) {
    flops += 6.0 * l.rows * l.in * l.out;
    eff += linear_effective_flops(l, hw);
  }
  return eff > 0 ? flops / eff : 1.0;
}

// A transformer block's linears on a rank of tensor-parallel degree tp holding `tokens` rows
// per micro-batch (sequence parallelism gathers the full rows before each GEMM); MoE blocks'
// experts each see tokens·top_k·ep / E rows (balanced routing, ep ranks' tokens arriving).
std::vector<Linear> block_linears(const ModelArgs& a, bool moe, double tp, double ep, double tokens) {
  const double d = double(a.dim), q = double(a.n_heads * a.head_dim) / tp, kv = double(a.n_kv_heads * a.head_dim) / tp;
  std::vector<Linear> ls = {{d, q, tokens}, {d, kv, tokens}, {d, kv, tokens}, {q, d, tokens}};
  if (!moe) {
    const double f = double(a.ffn_dim()) / tp;
    ls.insert(ls.end(), {{d, f, tokens}, {d, f, tokens}, {f, d, tokens}});
    return ls;
  }
  const double h = double(a.moe_inter_dim) / tp;
  const double rows = std::max(1.0, tokens * double(a.top_k) * ep / double(std::max<int64_t>(a.num_experts, 1)));
  for (int64_t e = 0; e < a.top_k; ++e) ls.insert(ls.end(), {{d, h, rows}, {d, h, rows}, {h, d, rows}});
  if (a.num_shared_experts > 0) {
    const double hs = h * double(a.num_shared_experts);
    ls.insert(ls.end(), {{d, hs, tokens}, {d, hs, tokens}, {hs, d, tokens}});
  }
  return ls;
}

// FlashAttention-2's causal speed against sequence length on an H100 (the FlashAttention-3
// paper's figure of forward speed with a causal mask, head dim 128: 191, 260, 298, 319, 333, 335
// TFLOP/s at 512 … 16k) fits T / (T + T½) with T½ = 350 within 8%; without a mask (309 … 370)
// the curve saturates about 3.5 times sooner (T½ ≈ 100).
constexpr double kNonCausalHalfRatio = 1.0 / 3.5;

}  // namespace

double gemm_shape_efficiency(double m, double n, const HardwareSpec& hw) {
  const double t = double(hw.gemm_tile), sms = double(hw.sm_count);
  if (m <= 0 || n <= 0) return 1.0;
  const double tiles = std::ceil(m / t) * std::ceil(n / t);
  const double waves = std::ceil(tiles / sms);
  return (m * n) / (waves * sms * t * t);
}

double attention_length_efficiency(double length, bool causal, int64_t head_dim, const HardwareSpec& hw) {
  const double half = hw.attention_half_seq * (causal ? 1.0 : kNonCausalHalfRatio);
  const double s = length / (length + half);
  // Head dim: the same figures at head dim 64 (causal, FlashAttention-2: 299 against 335 TFLOP/s at 16k) and
  // 256 (no mask: 326 against 370 at 128) run at 0.89 and 0.88 of head dim 128.
  const double l2 = std::log2(double(std::max<int64_t>(head_dim, 1)));
  const double h = l2 <= 7 ? std::max(0.5, 1.0 - 0.11 * (7 - l2)) : std::max(0.5, 1.0 - 0.12 * (l2 - 7));
  // A kernel that sweeps each query row's keys (meshtrain's cpu attention: scores, K and V of the
  // row's keys streamed once per head dim) slows as that working set grows, down to a floor:
  // floor + (1 − floor) / (1 + n / n_fall) with n the keys per row (on average half a causal
  // call's length).
  if (hw.attention_fall_seq <= 0) return s * h;
  const double row_keys = causal ? length / 2 : length, floor = hw.attention_fall_floor;
  return s * h * (floor + (1.0 - floor) / (1.0 + row_keys / hw.attention_fall_seq));
}

StepTimePrediction predict_step_time(const JobConfig& cfg, const ParallelDims& d, const PipelinePlan* plan,
                                     const std::vector<RankState>& states, const ActivationPrediction& act,
                                     const HardwareSpec& hw, const std::vector<RankPlace>& places,
                                     const ModelArgs* given, double document_tokens) {
  ModelArgs own;  // a reference to the caller's when given (the planner's many candidates share one)
  const ModelArgs& a = given ? *given : (own = cfg.model_args());
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

  StepTimePrediction p;

  // ---- compute ----
  const CheckpointPolicy ac =
      CheckpointPolicy::from_deck(cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option);
  // ac.recompute of every block index and the fraction recomputed, made once per (policy,
  // layers): the loops below ask for every block of every pipeline rank, and the planner
  // predicts a million candidates cycling through a few policies.
  struct RecomputeFlags {
    CheckpointPolicy::Mode mode = CheckpointPolicy::Mode::kNone;
    int64_t every = -1, layers = -1;
    std::vector<char> flags;
    double fraction = 0;
  };
  thread_local std::vector<RecomputeFlags> rec_memo;
  const RecomputeFlags* rec = nullptr;
  for (const RecomputeFlags& f : rec_memo)
    if (f.mode == ac.mode && f.every == ac.every && f.layers == a.n_layers) rec = &f;
  if (!rec) {
    if (rec_memo.size() >= 64) rec_memo.clear();  // bounded: a search tries about ten policies
    RecomputeFlags f;
    f.mode = ac.mode;
    f.every = ac.every;
    f.layers = a.n_layers;
    f.flags.assign(size_t(std::max<int64_t>(a.n_layers, 0)), 0);
    for (int64_t b = 0; b < a.n_layers; ++b) f.flags[size_t(b)] = ac.recompute(b) ? 1 : 0;
    for (int64_t b = 0; b < a.n_layers; ++b) f.fraction += f.flags[size_t(b)] ? 1.0 / double(a.n_layers) : 0.0;
    rec_memo.push_back(std::move(f));
    rec = &rec_memo.back();
  }
  auto recomputed = [&](int64_t b) {
    return b >= 0 && b < a.n_layers ? rec->flags[size_t(b)] != 0 : ac.recompute(b);
  };
  // Per-operator checkpointing reruns part of every block: its unkept matmuls (wk, wo, w3; the
  // MoE router and routed experts) but neither attention nor the kept collectives.
  const bool per_op = ac.mode == CheckpointPolicy::Mode::kOp;
  const double recompute_fraction = per_op ? 0.0 : rec->fraction;  // of the blocks, whose forward runs twice (ep)
  // Document masking (attn_mask_type = "block_causal"): each token attends its own document
  // only, and the kernels skip key blocks wholly outside the mask, so attention's FLOPs are the
  // causal ones × document_attention_share, its calls as long as a document at most.
  const bool doc_mask = a.attn_mask_type == "block_causal" && document_tokens > 0 && document_tokens < seq;
  const double doc_share = doc_mask ? document_attention_share(document_tokens, seq) : 1.0;
  auto call_length = [&](double length) { return doc_mask ? std::min(length, document_tokens) : length; };
  const double attn_per_block = 0.5 * 12.0 * double(a.n_heads) * double(a.head_dim) * seq * doc_share;  // causal half
  // Shapes: a micro-batch's rows on the rank (tokens of its local batch or pipeline micro-batch
  // after the cp cut), and the attention calls they make. Without cp one causal call over the
  // sequence; with cp the load-balanced cut gives each rank 2 chunks of c = seq / (2·cp) tokens
  // and the ring / all-gather path runs c × c blocks: 2 causal diagonal blocks and 2·cp − 1
  // unmasked ones (1/(2·cp) and the rest of the rank's attention FLOPs).
  const double mb_samples =
      double(d.pp > 1 && plan ? plan->microbatch_size : cfg.training.local_batch_size);
  const double rows = mb_samples * seq / double(d.cp);
  const bool chunked_cp = d.cp > 1 && cfg.parallelism.context_parallel_rotate_method != "ulysses";
  double attention_eff = hw.attention_efficiency;
  if (!chunked_cp) {
    // Ulysses attends the whole sequence with heads split over cp.
    attention_eff *= attention_length_efficiency(call_length(seq), true, a.head_dim, hw);
  } else {
    const double c = call_length(seq / double(2 * d.cp)), diag = 1.0 / double(2 * d.cp);
    attention_eff /= diag / attention_length_efficiency(c, true, a.head_dim, hw) +
                     (1 - diag) / attention_length_efficiency(c, false, a.head_dim, hw);
  }
  const double tp_d = double(d.tp), ep_d = double(std::max<int64_t>(d.ep, 1));
  // The shape efficiencies depend on the model, tp, ep, the rows and the hardware's tiles only:
  // the planner asks for the same ones under many other knobs, so the last answer is kept.
  const std::array<double, 15> shape_key = {tp_d, ep_d, rows, double(hw.sm_count), double(hw.gemm_tile),
                                            double(a.dim), double(a.ffn_dim()), double(a.n_heads),
                                            double(a.n_kv_heads), double(a.head_dim), double(a.vocab_size),
                                            double(a.num_experts), double(a.top_k), double(a.moe_inter_dim),
                                            double(a.num_shared_experts)};
  thread_local std::array<double, 15> last_key{};
  thread_local std::array<double, 3> last_eff{};
  if (shape_key != last_key) {
    last_eff[0] = shape_efficiency(block_linears(a, false, tp_d, ep_d, rows), hw);
    last_eff[1] = a.num_experts > 0 ? shape_efficiency(block_linears(a, true, tp_d, ep_d, rows), hw) : 1.0;
    last_eff[2] = shape_efficiency({{double(a.dim), double(a.vocab_size) / tp_d, rows}}, hw);
    last_key = shape_key;
  }
  const double dense_eff = last_eff[0], moe_eff = last_eff[1], head_eff = last_eff[2];
  // Chunked cross-entropy (loss_chunk_tokens below the micro-batch's rows, OutputHead): backward
  // recomputes each chunk's logits, one more head GEMM (2·D·V per token).
  const bool chunked_head = a.loss_chunk_tokens > 0 && double(a.loss_chunk_tokens) < rows;
  const double head_per_token = (chunked_head ? 8.0 : 6.0) * double(a.dim) * double(a.vocab_size);
  // Per token of the busiest pipeline rank: matmul FLOPs, their time in FLOPs at the large-GEMM
  // rate (FLOPs / shape efficiency), and attention FLOPs; and the rank with the most blocks,
  // with how many of them it recomputes. These depend on the split, the recomputation policy
  // and the efficiencies only: the planner asks for them under several ZeRO stages, dtypes and
  // cp rotations in a row, so the last few answers are kept per rank_states() result.
  struct Busiest {
    std::array<double, 12> key{};
    double mm = 0, mm_time = 0, attn = 0, stage_blocks = 0, stage_recomputed = 0;
    double fused_time = 0;  // the part of mm_time inside async TP's fused operators
  };
  thread_local std::array<Busiest, 8> busiest_memo;
  thread_local size_t busiest_next = 0;
  const int64_t split_id = states.empty() ? 0 : states.front().split_id;
  const std::array<double, 12> busiest_key = {double(split_id), double(states.size()), double(int(ac.mode)),
                                              double(ac.every), dense_eff, moe_eff, head_eff, attention_eff,
                                              hw.matmul_efficiency, attn_per_block, double(a.n_layers), head_per_token};
  const Busiest* known = nullptr;
  if (split_id > 0)
    for (const Busiest& b : busiest_memo)
      if (b.key == busiest_key) known = &b;
  Busiest made;
  if (!known) {
    for (const RankState& st : states) {
      double m_r = st.head ? head_per_token : 0.0, a_r = 0;
      double t_r = m_r / head_eff, fused_r = 0;
      for (size_t i = 0; i < st.blocks.size(); ++i) {
        const bool moe_block = a.is_moe_layer(st.blocks[i]);
        const double rec = recomputed(st.blocks[i]) ? 1.0 : 0.0;
        const double rec_mm = per_op ? per_op_recomputed_share(a, moe_block) : rec;
        const double f = (6.0 + 2.0 * rec_mm) * st.block_params[i];
        m_r += f;
        t_r += f / (moe_block ? moe_eff : dense_eff);
        fused_r += f * async_tp_fused_share(a, moe_block) / (moe_block ? moe_eff : dense_eff);
        a_r += attn_per_block * (1.0 + (per_op ? 0.0 : rec) / 3.0);
      }
      if (t_r / hw.matmul_efficiency + a_r / attention_eff >
          made.mm_time / hw.matmul_efficiency + made.attn / attention_eff)
        made.mm = m_r, made.mm_time = t_r, made.attn = a_r, made.fused_time = fused_r;
    }
    for (const RankState& st : states)
      if (double(st.blocks.size()) > made.stage_blocks) {
        made.stage_blocks = double(st.blocks.size());
        made.stage_recomputed = 0;
        for (int64_t b : st.blocks) made.stage_recomputed += recomputed(b) && !per_op ? 1.0 : 0.0;
      }
    made.key = busiest_key;
    if (split_id > 0) {
      busiest_memo[busiest_next] = made;
      busiest_next = (busiest_next + 1) % busiest_memo.size();
    }
    known = &made;
  }
  double mm = known->mm, mm_time = known->mm_time, attn = known->attn;
  const double stage_blocks = known->stage_blocks, stage_recomputed = known->stage_recomputed;
  mm *= t_replica / double(d.tp);
  mm_time *= t_replica / double(d.tp);
  const double fused_time = known->fused_time * t_replica / double(d.tp);
  attn *= t_replica / double(d.tp);
  p.matmul_shape_efficiency = mm_time > 0 ? mm / mm_time : 1.0;
  p.attention_efficiency = attention_eff;
  int64_t local_params = 0;
  for (const RankState& st : states) local_params = std::max(local_params, d.dp_shard * d.cp > 1 ? st.shard : st.flat);
  // Memory-bound kernels: the activations a micro-batch keeps, each written in forward, read in
  // backward, its gradient written and read, ~6 passes, at memory_efficiency; the optimizer's
  // multi-tensor AdamW streams 28 bytes per local element at the full bandwidth.
  const double traffic = 6.0 * double(act.per_microbatch_rank) * double(micro);
  // Under Muon its matrices stream 20 bytes per element instead (parameter read and written,
  // gradient read, one momentum read and written).
  const bool muon = uses_muon(cfg);
  int64_t local_muon = 0;
  if (muon)
    for (const RankState& st : states) local_muon = std::max(local_muon, d.dp_shard * d.cp > 1 ? st.shard_muon : st.flat_muon);
  const double optimizer_bytes = 28.0 * double(local_params) - 8.0 * double(local_muon);
  // The pipeline bubble, as a fraction of compute: the schedule's textbook figure (a CSV
  // schedule: simulated).
  const bool pipelined = d.pp > 1;
  double bubble_fraction = 0;
  if (pipelined && plan) {
    // The formula's value for the last schedule asked (it formats a description each call).
    struct LastBubble {
      std::string name;
      int pp = 0, m = 0, v = 0;
      double value = 0;
    };
    thread_local LastBubble last;
    const PipelineSchedule& s = plan->schedule;
    if (s.name == last.name && s.pp == last.pp && s.microbatches == last.m && s.stages_per_rank == last.v) {
      bubble_fraction = last.value;
    } else {
      try {
        bubble_fraction = textbook_bubble(s).value;
        last = {s.name, s.pp, s.microbatches, s.stages_per_rank, bubble_fraction};
      } catch (const std::exception&) {
        bubble_fraction = simulate_schedule(s, {}, false, /*timeline=*/false).bubble_fraction();
      }
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
  // Context parallelism's chunked attention merges every block's float32 output into the
  // running result (read both, write one: 12 bytes per output element, plus the log-sum-exp) and
  // in backward accumulates dQ and the packed dK/dV in float32 per block (read and write: 8
  // bytes), and the ring adds its dK/dV partial sums once per step (zero, add, send: 12 bytes).
  // Per block (layer) and micro-batch, on the rank: the forward's bytes run again when recomputed.
  double cp_merge_fwd = 0, cp_merge_bwd = 0;
  if (chunked_cp) {
    const double blocks = double(2 * d.cp + 1), c_rows = rows / 2;  // c × c calls, c rows each
    const double qd = double(a.n_heads * a.head_dim) / tp_d, kd = double(a.n_kv_heads * a.head_dim) / tp_d;
    cp_merge_fwd = blocks * c_rows * (qd * 12.0 + double(a.n_heads) / tp_d * 12.0);
    cp_merge_bwd = blocks * c_rows * (qd + 2 * kd) * 8.0 +
                   (cfg.parallelism.context_parallel_rotate_method == "alltoall" ? double(d.cp) * 2 * rows * kd * 12.0 : 0);
  }
  const double merge_bytes = double(micro) * (stage_blocks * (cp_merge_fwd + cp_merge_bwd) + stage_recomputed * cp_merge_fwd);
  p.compute_s = mm_time / (peak * hw.matmul_efficiency) + attn / (peak * attention_eff) +
                (traffic + merge_bytes) / (bandwidth * hw.memory_efficiency) + optimizer_bytes / bandwidth;
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
  // A tier's bandwidth (× comm_efficiency) and latency: NVLink inside a node, the network across.
  auto link = [&](const char* t) {
    const bool intra = std::string_view(t) == "node";
    return std::make_pair((intra ? hw.intra_node_bandwidth : hw.inter_node_bandwidth) * hw.comm_efficiency,
                          intra ? hw.intra_node_latency_s : hw.inter_node_latency_s);
  };
  auto add = [&](const char* dim, int64_t stride, int64_t size, double bytes, double collectives) {
    if (size <= 1 || bytes <= 0) return;
    CommTime c;
    c.dim = dim;
    c.tier = tier(stride, size);
    const auto [bw, lat] = link(c.tier);
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
  // Muon (plan/muon_model.hpp): each matrix gathered whole in float32 to one owner of its
  // FSDP-shard × tp group (the g = tp·fsdp consecutive ranks), orthogonalized there, scattered
  // back: each rank sends and receives its shard of every matrix, 2 · 4 · shard · (g − 1) / g
  // bytes (the owner receiving the (g − 1)/g of its matrices the others hold, owners dealt out
  // evenly), one message per matrix each way. Owners share a group's matrices evenly (no rank
  // below its largest one), at the device's large-GEMM rate; replicated (g = 1) every rank
  // orthogonalizes its stage's matrices itself.
  if (muon) {
    const int64_t g = d.tp * fsdp;
    double ns = 0, moved = 0, matrices = 0;
    for (const RankState& r : states) {
      ns = std::max(ns, std::max(r.muon_ns_flops / double(g), r.muon_ns_largest));
      moved = std::max(moved, double(r.shard_muon));  // this rank's piece of each matrix (tp-local, FSDP shard)
      matrices = std::max(matrices, double(r.muon_matrices));
    }
    p.muon_s = ns * double(cfg.optimizer.muon_num_ns_steps) / (peak * hw.matmul_efficiency);
    add("muon", 1, g, 2.0 * 4.0 * moved * double(g - 1) / double(g), 2.0 * matrices / double(g));
  }
  // Exposure (see the header).
  const double overlap = hw.comm_overlap * p.compute_s;
  // The ring's hops, per block (layer) and micro-batch: each hop carries the next step's K/V
  // (2·rows·K·β bytes; in backward followed by the f32 dK/dV partial sums, 2·rows·K·4) while the
  // rank computes the current step's blocks and merges (1/cp of the layer's attention and merge
  // work), so a hop shows only beyond that step; the last partial sum's hop, after the last
  // step, is never hidden. A recomputed forward repeats the forward's hops.
  double ring_exposed = 0;
  if (d.cp > 1 && cfg.parallelism.context_parallel_rotate_method == "alltoall" && stage_blocks > 0) {
    const auto [bw, lat] = link(tier(d.tp, d.cp));
    const double kd = double(a.n_kv_heads * a.head_dim) / tp_d, cp = double(d.cp);
    const double hop_kv = 2 * rows * kd * beta / bw + lat, hop_dkv = 2 * rows * kd * 4 / bw + lat;
    const double slow = cpu_backend && busy_ranks > cores ? busy_ranks / cores : 1.0;
    const double attn_fwd_layer = 2.0 * double(a.n_heads) / tp_d * double(a.head_dim) * seq * 0.5 * rows * doc_share;
    const double mem_bw = bandwidth * hw.memory_efficiency;
    const double step_fwd = slow * (attn_fwd_layer / (peak * attention_eff) + cp_merge_fwd / mem_bw) / cp;
    const double step_bwd = slow * (2 * attn_fwd_layer / (peak * attention_eff) + cp_merge_bwd / mem_bw) / cp;
    const double fwd = (cp - 1) * std::max(0.0, hop_kv - step_fwd);
    const double bwd = (cp - 1) * std::max(0.0, hop_kv + hop_dkv - step_bwd) + hop_dkv;
    ring_exposed = double(micro) * (stage_blocks * (fwd + bwd) + stage_recomputed * fwd);
  }
  // Async TP: the blocks' share of the tp collectives (4 of the 4·L/pp + 2 per micro-batch) runs
  // as tp − 1 ring hops per fused operator, each beside one row block's GEMM: at most the fused
  // GEMMs' (tp − 1)/tp can hide them, and the hardware's async_tp_overlap says how much of them
  // does (fitted to TorchTitan's published AsyncTP row); the embedding's and output head's 2 stay
  // synchronous.
  const bool async_tp = cfg.parallelism.enable_async_tensor_parallel && cfg.parallelism.enable_sequence_parallel && d.tp > 1;
  const double tp_block_share = 4.0 * double(a.n_layers) / double(d.pp) / (4.0 * double(a.n_layers) / double(d.pp) + 2);
  const double tp_hideable = async_tp ? ring(d.tp) * fused_time / (peak * hw.matmul_efficiency) : 0.0;
  double hidden_budget = overlap;  // compute that async collectives may hide behind, shared
  for (CommTime& c : p.comm) {
    const std::string_view dim = c.dim;
    if (dim == "tp" && async_tp) {
      c.exposed_s = c.seconds - std::min(hw.async_tp_overlap * tp_block_share * c.seconds, tp_hideable);
    } else if (dim == "tp" || dim == "ep" || dim == "pp" || dim == "muon" ||
        (dim == "cp" && cfg.parallelism.context_parallel_rotate_method != "alltoall")) {
      c.exposed_s = c.seconds;
    } else if (dim == "cp") {
      c.exposed_s = std::min(c.seconds, ring_exposed);
    } else {
      const double first = units > 0 ? c.seconds / (units * double(micro)) : 0;  // the first gather shows
      const double hidden = std::min(hidden_budget, c.seconds - first);
      hidden_budget -= hidden;
      c.exposed_s = c.seconds - hidden;
    }
    p.exposed_comm_s += c.exposed_s;
  }
  p.bubble_s = bubble_fraction * p.compute_s;
  p.step_s = p.compute_s + p.exposed_comm_s + p.bubble_s + p.muon_s;
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
