#pragma once
/// @file Step time of one configuration on one hardware entry: compute, exposed communication
/// per mesh dimension and the tier it crosses, and the pipeline bubble (the decomposition
/// T_step = T_compute + T_comm − T_overlap + T_idle of the configuration study in the hardware
/// references, with its formulas corrected; doc/plan.md lists each correction).
///
/// Compute, for the busiest pipeline rank (t = tokens a dp × cp replica runs per step = global
/// tokens / (dp·cp), split over tp):
///   matmul FLOPs    (Σ over its blocks of (6 + 2·recomputed)·P_block + 6·D·V with the head)·t/tp
///                   (Kaplan et al. 2020: the forward's 2·N plus the backward's 4·N; recomputed
///                   blocks add their forward's 2·N; a chunked cross-entropy head, loss_chunk_tokens
///                   below the micro-batch's rows, 8·D·V: backward recomputes the logits)
///   attention FLOPs Σ over its blocks of 6·Hq·Dh·T·(1 + recomputed/3)·t/tp (half of PaLM's
///                   12·H·Dh·T per layer: causal flash attention skips the masked half), × the
///                   document_attention_share under block_causal (plan/document_mask.hpp)
///   memory traffic  6 × the activation bytes a micro-batch keeps on the rank × micro-batches
///                   (each written in forward, read in backward, its gradient written and read)
///   optimizer       AdamW's 28 bytes per local parameter element, streamed (Muon's matrices 20)
///   T_compute = matmul / (peak · matmul_efficiency) + attention / (peak · attention_efficiency)
///               + traffic / (bandwidth · memory_efficiency) + optimizer / bandwidth; on the cpu
///               entry the bandwidth is the node's split over its busy ranks, and busy ranks
///               beyond the core count multiply the time by busy ranks / cores (they time-slice
///               the cores); a pipeline rank in its bubble yields its core, so busy ranks =
///               ranks per node / (1 + bubble fraction).
/// Communication: the bytes each rank sends per step and dimension (the ring volumes of
/// perf/comm_volume and layout/comm_volume.hpp; FSDP from the exact shard sizes), over the
/// bandwidth of the tier its group spans (inside a node: NVLink; across: the network), plus
/// (group − 1) latency hops per collective. Exposed: all of tensor parallelism (under async TP,
/// enable_async_tensor_parallel with sequence parallelism, only what the blocks' fused
/// all-gather-matmul / matmul-reduce-scatter do not hide: each of their tp − 1 ring hops runs
/// beside the GEMM of one row block, so the blocks' tp seconds shrink by async_tp_overlap of
/// themselves (the hardware entry's), at most (tp − 1)/tp of those GEMMs' time; the embedding's
/// and the output head's collectives stay exposed), expert
/// parallelism and all-gather context parallelism (the code waits for them), the part of the
/// FSDP / ZeRO / data-parallel collectives that comm_overlap × compute cannot hide (the first
/// unit's gather always shows), the ring's K/V beyond the attention it overlaps.
/// Bubble: the schedule's textbook fraction (parallel/pipeline/simulate.hpp) × T_compute.
/// Muon (plan/muon_model.hpp): T_muon, the Newton–Schulz FLOPs of the busiest owner at
/// peak · matmul_efficiency, after the step's backwards; its gather / scatter ("muon") exposed.
/// T_step = T_compute + exposed communication + bubble + T_muon.
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "config/pipeline_plan.hpp"
#include "plan/hardware.hpp"
#include "plan/memory_model.hpp"
#include "topology/topology.hpp"

namespace meshtrain {

/// One dimension's traffic.
struct CommTime {
  const char* dim = "";   ///< "tp", "fsdp", "efsdp", "dp_replicate", "cp", "ep", "pp", "muon"
  const char* tier = "";  ///< the widest tier its groups span: "node", "rack" (one leaf switch) or "spine"
  double bytes = 0;     ///< sent per rank per step
  double seconds = 0;   ///< if nothing overlapped it
  double exposed_s = 0; ///< what the step waits for
};

struct StepTimePrediction {
  double compute_s = 0;   ///< T_compute (recomputation included)
  double bubble_s = 0;    ///< pipeline idle
  double muon_s = 0;      ///< Muon's Newton–Schulz iterations on the busiest owner (0 without Muon)
  std::vector<CommTime> comm;
  double exposed_comm_s = 0;  ///< Σ exposed
  double step_s = 0;
  double tokens_per_s_per_device = 0;
  double mfu = 0;  ///< flops_per_token (ModelArgs) · tokens / (step · devices · peak)
  /// The busiest rank's GEMMs together, achieved / large-GEMM rate (tile and wave
  /// quantization, gemm_shape_efficiency), in (0, 1].
  double matmul_shape_efficiency = 1;
  /// Attention's achieved / peak: the catalog's attention_efficiency × the length and head-dim
  /// factor of its calls (attention_length_efficiency; under cp, of the c × c blocks).
  double attention_efficiency = 0;
};

/// Tile and wave quantization of a GEMM with an M × N output on `hw`: the output is cut into
/// gemm_tile × gemm_tile tiles, sm_count of them run at once (one wave), so the work done is
/// M·N / (waves · sm_count · tile²) of what the SMs are held for (Calculon's and NVIDIA's
/// matrix-multiplication performance guide's tile- and wave-quantization model). In (0, 1];
/// 1 for M or N ≤ 0. Throws nothing.
double gemm_shape_efficiency(double m, double n, const HardwareSpec& hw);

/// Flash attention's speed at a call over `length` keys per query block, relative to its
/// long-sequence speed at head dim 128: length / (length + T½) with T½ = hw.attention_half_seq
/// (causal; an unmasked block saturates 3.5× sooner), times a head-dim factor (0.89 at 64, 1 at
/// 128, 0.88 at 256; FlashAttention-3 paper, H100 forward speed figures), and, on an entry with
/// attention_fall_seq > 0 (the cpu kernel, which sweeps each query row's keys), times
/// floor + (1 − floor) / (1 + n / attention_fall_seq) with floor = attention_fall_floor and n the
/// keys per query row (length / 2 causal, length unmasked; fitted on this machine,
/// doc/plan.md). In (0, 1]. Throws nothing.
double attention_length_efficiency(double length, bool causal, int64_t head_dim, const HardwareSpec& hw);

/// The prediction for `cfg` on `dims` (validated; `plan` as for predict_memory) on `hw`, with
/// `states` = rank_states(...) of the same configuration and `places` every rank's node and rack
/// (placement_for). `document_tokens`: under attn_mask_type = "block_causal", the token-weighted
/// mean document length attention follows (plan/document_mask.hpp); 0 counts it as causal.
/// @throws std::invalid_argument when the hardware has no peak for the run's dtype or `places`
/// has fewer ranks than the world.
StepTimePrediction predict_step_time(const JobConfig& cfg, const ParallelDims& dims, const PipelinePlan* plan,
                                     const std::vector<RankState>& states, const ActivationPrediction& act,
                                     const HardwareSpec& hw, const std::vector<RankPlace>& places,
                                     const ModelArgs* args = nullptr, double document_tokens = 0);

/// Where `world` ranks sit: devices_per_node consecutive ranks per node (the cpu entry: the
/// deck's [topology] ranks_per_node, all on one node when the world is smaller), racks from the
/// Slurm topology.conf `topology_file` when given, else the deck's [topology] nodes_per_rack
/// (0: one rack). @throws ConfigError for a topology file that does not parse.
std::vector<RankPlace> placement_for(const JobConfig& cfg, int64_t world, const HardwareSpec& hw,
                                     const std::string& topology_file);

}  // namespace meshtrain
