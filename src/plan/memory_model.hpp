#pragma once
/// @file Per-rank peak memory of one configuration, by the caching allocator's categories
/// (tensor/memory.hpp): parameters, gradients, optimizer, activations, communication,
/// temporaries — predicted before any allocation, for `meshtrain plan` and train's start-up
/// line.
///
/// Parameters, gradients and optimizer state are exact (the buffers the code allocates, for the
/// rank holding the most): with P_p the tp-local numel of parameter p (routed experts: E/ep of
/// them), R_p × C_p its rows × row elements, G the group it is sharded over (fsdp = dp_shard × cp;
/// routed experts under ep > 1: efsdp = fsdp / ep) and a16(x) = x rounded up to 16 elements:
///   flat  = 4 · Σ_p a16(P_p)               (the model's own f32 buffers)
///   shard = 4 · Σ_p a16(⌈R_p / G⌉ · C_p)   (FSDP's padded dim-0 shards, parallel/fsdp/shard_plan)
///   DDP: parameters flat, gradients flat, optimizer 2·flat (AdamW's exp_avg and exp_avg_sq);
///   ZeRO-1: parameters flat, gradients flat + shard, optimizer 2·shard;
///   ZeRO-2: parameters flat, gradients shard, optimizer 2·shard;
///   ZeRO-3 (FSDP): parameters shard, gradients shard, optimizer 2·shard;
/// plus, under bf16 compute with replicated parameters, a bf16 copy (2 · Σ a16(P_p)), and
/// E floats of selection bias per MoE block. Under Muon (`[optimizer] name = "Muon"`,
/// plan/muon_model.hpp) the optimizer state of the blocks' matrices is one float32 momentum
/// (1·flat or 1·shard of them) and AdamW's 2· stays for the rest; its step adds, beside the
/// state alone, the owner's float32 workspace of the largest matrix (communication category).
/// Pipeline stages differ: every pp rank is computed and the largest kept.
///
/// Activations come from plan/activation_model.hpp. Communication holds FSDP's unsharded units in
/// flight (the unit being computed and the next one prefetched: parameters gathered, gradients
/// being reduce-scattered), context parallelism's K/V buffers, expert parallelism's exchanged
/// rows and pipeline send / receive buffers. Temporaries are kernel scratch; on the cpu backend
/// the start-up measurement of the matmul rate (three 1024² float matrices) sets the peak.
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "config/job_config.hpp"
#include "config/pipeline_plan.hpp"
#include "plan/activation_model.hpp"

namespace meshtrain {

/// Bytes per category, in tensor/memory.hpp's MemCategory order.
struct MemoryPrediction {
  int64_t parameters = 0, gradients = 0, optimizer = 0, activations = 0, communication = 0, temporaries = 0;
  /// The peak of all categories together during a training step (what a device must hold):
  /// state + activations + communication at the step's high-water mark.
  int64_t total = 0;
  int64_t state() const { return parameters + gradients + optimizer; }
};

/// The model part one pp rank runs and the sizes of the state it holds, in elements (the
/// building blocks of predict_memory, shared with the time model's byte counts).
struct RankState {
  std::vector<int64_t> blocks;     ///< global block indices, ascending
  /// Active matmul parameters of each block (same order): attention D·Dh·(2·Hq + 2·Hkv) and the
  /// dense FFN 3·D·F, or the router E·D and top_k + shared experts of 3·D·H_moe.
  std::vector<double> block_params;
  bool embedding = true, head = true;
  std::shared_ptr<const std::vector<ActivationShape::Stage>> stages;  ///< the rank's pipeline stages (one without pp)
  int64_t flat = 0;                ///< Σ a16(P_p): the model's flat buffers
  int64_t shard = 0;               ///< Σ a16(⌈R_p/G⌉·C_p) over every held parameter
  int64_t shard_experts = 0;       ///< the routed experts' part of `shard` (G = efsdp under ep)
  /// Muon (plan/muon_model.hpp): the part of `flat` and `shard` in the 2-D hidden matrices it
  /// orthogonalizes (the rest stays on AdamW).
  int64_t flat_muon = 0, shard_muon = 0;
  /// Muon's Newton–Schulz work on this rank's blocks' whole matrices, per iteration (FLOPs): all
  /// of them, and the largest single matrix; their count (experts one by one); and the largest
  /// matrix's workspace (newton_schulz_workspace, float32 elements).
  double muon_ns_flops = 0, muon_ns_largest = 0;
  int64_t muon_matrices = 0, muon_workspace = 0;
  /// One FSDP sharding unit (the embedding, each block, the head; the head joins the embedding
  /// when tied), in forward order: Σ a16(P_p) unsharded, and the all-gather output G·Σ a16(⌈R/G⌉·C).
  struct Unit {
    int64_t full = 0, gather = 0;
    int64_t gather_local = 0;  ///< the part of `gather` over a group of one rank (completes at once)
  };
  std::vector<Unit> units;
  /// The unit holding each block (by global index), the embedding (key −2) and the head (key
  /// n_layers): an index into `units`.
  std::map<int64_t, size_t> unit_of;
  /// Per stage of `stages`, its units in forward order (indices into `units`).
  std::vector<std::vector<size_t>> stage_units;
  int64_t unit_grads_all = 0;  ///< every unit's unsharded float32 gradients, bytes (4·Σ full)
  int64_t unit_full_max = 0;       ///< the largest unit's Σ a16(P_p)
  int64_t unit_gather_max = 0;     ///< the largest unit's all-gather output, G·shard
  /// The largest buffer tp_grads packs the gradients partial over tp into (norms under sequence
  /// parallelism; the router and experts too), elements, at most kTpGradChunkElems: of whole
  /// parameters (DDP), or of this rank's shards of them (ZeRO / FSDP).
  int64_t tp_partial = 0, tp_partial_sharded = 0;
  int64_t moe_layers = 0;
  /// Under ep > 1, the units holding no routed expert: the experts' FSDP instance still allocates
  /// its (empty) shard buffers for them, one byte each (tensor/tensor.cpp never allocates 0).
  int64_t units_without_experts = 0;
  int64_t in_flight = 1;           ///< the schedule's peak in-flight stage micro-batches
  /// The simulator's in-flight states of this rank (SimulationResult::in_flight_states; null
  /// without pp) and their ActivationShape::states_id (0 without pp).
  std::shared_ptr<const std::vector<SimulationResult::InFlightState>> in_flight_states;
  int64_t states_id = 0;
  /// Equal for ranks whose predictions are equal (state sizes, stage shapes, MoE pattern).
  std::string signature;
  /// A number per distinct signature in this process (equal numbers, equal signatures).
  int64_t signature_id = 0;
  /// A number per rank_states() result in this process, the same on each of its ranks (never
  /// reused, so it names the result's contents); 0 for states made otherwise.
  int64_t split_id = 0;
  /// The same for the ranks of rank_states() results that differ only in the FSDP group (equal
  /// stages and in-flight states rank by rank, so equal activations); 0 for states made otherwise.
  int64_t activation_split_id = 0;
};

/// Every pp rank's RankState (memoized per model split). @throws std::invalid_argument (tp /
/// ep that do not split).
std::shared_ptr<const std::vector<RankState>> rank_states(const ModelArgs& args, const ParallelDims& dims, const PipelinePlan* plan,
                                   bool sequence_parallel);

/// The configuration as the trainer would build it from `cfg` on `dims` (validated). `plan` is
/// cfg.pipeline_plan(dims) when pp > 1 (its schedule's peak in-flight micro-batches), else null.
/// @throws ConfigError or std::invalid_argument for a configuration that does not build.
/// `states` and `act`, when given, receive every rank's RankState and the activation replay of
/// the rank with the largest activations (for the time model); `args`, when given, is
/// cfg.model_args() already computed (the planner's many candidates share one model), and
/// `known`, when given, rank_states(args, dims, plan, enable_sequence_parallel) already computed
/// (the planner asks once for the candidates that differ only in other knobs). `stop_above`:
/// once the total is known to exceed it, the remaining ranks' totals are not summed and `total`
/// is a lower bound, still above stop_above (the planner needs the exact total only of a
/// configuration that fits, or that may use the least memory of its family); every other
/// category is exact.
MemoryPrediction predict_memory(const JobConfig& cfg, const ParallelDims& dims, const PipelinePlan* plan,
                                std::shared_ptr<const std::vector<RankState>>* states = nullptr,
                                std::shared_ptr<const ActivationPrediction>* act = nullptr,
                                const ModelArgs* args = nullptr,
                                std::shared_ptr<const std::vector<RankState>> known = nullptr,
                                int64_t stop_above = std::numeric_limits<int64_t>::max());

/// "parameters 1.2 GiB, gradients …, total …" — one line for logs and tables. Throws nothing.
std::string describe_memory(const MemoryPrediction& m);

}  // namespace meshtrain
