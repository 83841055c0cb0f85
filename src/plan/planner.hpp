#pragma once
/// @file The planner: every valid configuration of a deck's model and batch on N devices, each
/// with its predicted memory (plan/memory_model.hpp) and step time (plan/time_model.hpp),
/// ranked by tokens/s among those that fit. Validity is JobConfig::validate(), the function
/// `meshtrain train` runs, so plan and train never disagree on a rule.
///
/// The knobs enumerated (each held at the deck's value when named in PlanOptions::fixed):
///   degrees      tp | n_kv_heads (and | n_heads), pp, cp, dp_replicate × dp_shard = the rest,
///                ep | dp_shard × cp (MoE models only)
///   batch        local_batch_size (the deck's global batch fixed; the rest is gradient
///                accumulation), pp micro-batch size
///   pipeline     schedule (1F1B, Interleaved1F1B, GPipe, InterleavedZeroBubble, ZBVZeroBubble)
///   cp           rotate method (allgather, alltoall)
///   memory       activation checkpointing none / selective / full, ZeRO stage 1 / 2 / 3,
///                fsdp_reshard_after_forward default / never. Selective is one candidate per
///                configuration: every N-th block recomputed, N = 2 unless no AC does not fit
///                and N = 2 does, then the largest N that fits (bisected over the distinct
///                counts ceil(layers / N) of recomputed blocks, memory rising with N; the
///                fastest fitting N tried is kept)
///   precision    reduce dtype float32 / bfloat16 (bf16 decks)
///
/// Ranking: predictions carry the hardware entry's error band (step_time_error); the fitting
/// configurations within it of the fastest are ties ordered by simplicity (PlanResult::ranked),
/// and those above PlanOptions::pressure of the usable memory are risky and come after the rest
/// of the ties.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "plan/hardware.hpp"
#include "plan/memory_model.hpp"
#include "plan/time_model.hpp"

namespace meshtrain {

/// One configuration: the deck keys it sets, and its predictions.
struct PlanCandidate {
  ParallelDims dims;
  int64_t local_batch = 1, microbatch = 1, grad_accum = 1;
  std::string schedule, rotate, ac_mode = "none", ac_option = "2", reshard = "default", reduce_dtype = "float32";
  int zero = 3;
  MemoryPrediction memory;
  StepTimePrediction time;
  bool fits = false;
  /// 1 − predicted total / usable memory (device memory less the fragmentation margin).
  double headroom = 0;
  /// Predicted above PlanOptions::pressure of the usable memory: ranked after layouts with
  /// headroom whose speed is within the error band.
  bool risky = false;
  /// Predicted within the hardware's step_time_error of the fastest fitting configuration (its
  /// speed cannot be told apart from the fastest's).
  bool within_error = false;
  /// Mesh dimensions above 1: model-parallel ones (tp, cp, pp, ep) and data-parallel ones
  /// (dp_replicate, dp_shard).
  int model_dims() const;
  int data_dims() const;
  /// Bytes per rank and step on groups that cross racks (tier "spine").
  double cross_rack_bytes() const;
  /// "TP 8 × FSDP 32", "HSDP 2 × 4", "DDP 8" …: the degrees greater than one.
  std::string family() const;
  /// "mbs 2, GA 4, 1F1B, AC full, ZeRO-3": the other knobs. Throws nothing.
  std::string knobs() const;
  /// The deck keys this configuration sets, "section.key" → TOML value.
  std::map<std::string, std::string> deck_keys() const;
};

struct PlanOptions {
  int64_t devices = 8;
  HardwareSpec hardware;
  /// Deck keys held at the deck's value: "parallelism.tensor_parallel_degree", … or "all".
  std::set<std::string> fixed;
  int64_t top = 10;  ///< how many of the fastest fitting configurations to keep whole
  /// Slurm topology.conf whose racks tell which groups cross a leaf switch ("": the deck's
  /// [topology] file, else its nodes_per_rack).
  std::string topology_file;
  /// Fraction of the usable memory above which a configuration is "risky" (allocator retries and
  /// fragmentation near the limit; PyTorch's caching allocator starts freeing and retrying there).
  double pressure = 0.9;
  /// Under attn_mask_type = "block_causal": the token-weighted mean document length (tokens) the
  /// attention time follows (plan/document_mask.hpp); 0 counts attention as causal.
  double document_tokens = 0;
};

struct PlanResult {
  int64_t enumerated = 0;  ///< configurations generated
  int64_t valid = 0;       ///< of those, accepted by validate()
  int64_t fitting = 0;     ///< of those, predicted within the device memory
  double seconds = 0;      ///< wall time of the search
  double memory_limit = 0; ///< bytes: device memory × (1 − fragmentation)
  double error_band = 0;   ///< the hardware's step_time_error, relative
  /// The `top` recommended fitting configurations: those within the error band of the fastest
  /// first (within_error set), ordered by simplicity — not risky before risky, fewer
  /// model-parallel then fewer data-parallel dimensions above 1, fewer bytes across racks, more
  /// headroom, then speed — and after them the next fastest, by speed.
  std::vector<PlanCandidate> ranked;
  /// The fastest fitting configuration by predicted tokens/s alone (ranked's first can differ
  /// when a simpler one is within the error band).
  std::vector<PlanCandidate> fastest;
  /// (predicted total memory in bytes, tokens/s per device) of every fitting configuration.
  std::vector<std::pair<double, double>> points;
  std::vector<PlanCandidate> best_per_family;  ///< the fastest fitting one of each family, fastest first
  /// Families with no fitting configuration: the one using the least memory, and why it fails.
  std::vector<std::pair<PlanCandidate, std::string>> rejected;
  /// validate()'s first message per rule that refused configurations, with how many.
  std::map<std::string, int64_t> invalid_reasons;
};

/// The knobs the planner varies, as deck keys (what PlanOptions::fixed may name).
const std::vector<std::string>& plan_knobs();

/// Searches every configuration of `deck` (its model, seq_len, global batch and device) on
/// opts.devices devices. @throws ConfigError for a deck whose global batch cannot be known
/// (global_batch_size = -1 and its own layout invalid on N devices) or an unknown fixed key.
PlanResult run_plan(const JobConfig& deck, const PlanOptions& opts);

/// The prediction for the deck's own configuration (validated) on `hw`: what `meshtrain train`
/// prints at start-up. @throws ConfigError as validate().
PlanCandidate predict_deck(const JobConfig& deck, int64_t world, const HardwareSpec& hw);

/// `deck` with `c`'s keys applied. @throws ConfigError if they do not parse.
JobConfig apply_candidate(const JobConfig& deck, const PlanCandidate& c);

}  // namespace meshtrain
