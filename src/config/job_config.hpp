#pragma once
/// @file JobConfig: the resolved, typed contents of one input deck plus command-line overrides.
/// Key names follow TorchTitan's job config (torchtitan/config/job_config.py) so presets port
/// with little change. The option registry (option_registry.hpp) is the single source of truth
/// for keys, types, defaults and ranges; this struct is what the rest of meshtrain reads.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/model_args.hpp"

namespace meshtrain {

struct PipelinePlan;  // config/pipeline_plan.hpp
struct StageLayers;   // parallel/pipeline/stage_split.hpp

/// [job]
struct JobSection {
  std::string dump_folder;   ///< run output folder; "" means checkpoint/<deck name>/
  std::string description;   ///< free text; kept in deck.resolved.toml and every checkpoint's /meta deck
  bool final_dump = true;    ///< write model_final.h5 (unsharded f32 weights) at the end of the run
  bool print_config = false; ///< log the resolved deck at start (TorchTitan's key)
};

/// [model]: name + flavor select a published shape; the other keys override single fields
/// (a key left unset keeps the flavor's value).
struct ModelSection {
  std::string name = "llama3";      ///< llama3 | qwen3 | mixtral
  std::string flavor = "debugmodel";
  /// Folder of Hugging Face assets (tokenizer.model / tokenizer.json, ...): read by `meshtrain
  /// data prepare --hf-assets-path`, its tokenizer files copied by `ckpt export`; "" = none.
  std::string hf_assets_path;
  std::optional<int64_t> dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of, head_dim,
      ffn_hidden_dim;
  std::optional<double> ffn_dim_multiplier, norm_eps, rope_theta;
  std::optional<bool> qk_norm, tie_word_embeddings, use_rope_scaling;
  std::optional<double> rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
  std::optional<int64_t> rope_original_max_seq_len;
  // Mixture of Experts (model_args.hpp); unset keeps the flavor's value.
  std::optional<int64_t> num_experts, top_k, num_shared_experts, moe_inter_dim, n_dense_layers, moe_layer_step;
  std::string score_func;  ///< softmax | sigmoid; "" = the flavor's
  std::optional<bool> route_norm;
  std::optional<double> route_scale, load_balance_coeff, aux_loss_coeff, z_loss_coeff;
  std::string attn_type;       ///< sdpa | flex | varlen; "" = the flavor's
  std::string attn_mask_type;  ///< causal | block_causal; "" = the flavor's
  /// PaLM's z-loss on the output logits, ζ · log²Z per token (Chowdhery et al. 2022, §5); 0 = off.
  /// Not the router's z_loss_coeff above.
  double output_z_loss_coeff = 0;
  /// Tokens per chunk of the output head and its loss (chunked cross-entropy: logits buffer
  /// [chunk, V_local] instead of [N, V_local]); a multiple of 256; 0 = unchunked.
  int64_t loss_chunk_tokens = 0;
  bool operator==(const ModelSection&) const = default;
};

/// [optimizer]
struct OptimizerSection {
  std::string name = "AdamW";   ///< AdamW (Loshchilov & Hutter 2019) or Muon (optim/muon.hpp)
  double lr = 8e-4;             ///< peak lr (Muon: of the matrices; AdamW's group too unless adamw_lr)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_embeddings_and_norms = false;  ///< apply weight decay to embeddings and norm weights too
  // Muon (name = "Muon"), Megatron-Core's names.
  double muon_momentum = 0.95;
  bool muon_use_nesterov = true;
  int64_t muon_num_ns_steps = 5;
  std::string muon_scale_mode = "spectral";  ///< spectral | shape_scaling | unit_rms_norm
  double muon_extra_scale_factor = 0.2;      ///< 0.2 with spectral: Moonlight's AdamW-RMS match
  std::optional<double> adamw_lr;            ///< Muon's AdamW group (embeddings, head, norms); unset: lr
  std::optional<double> adamw_weight_decay;  ///< unset: weight_decay
  bool operator==(const OptimizerSection&) const = default;
};

/// [lr_scheduler]: linear warmup, a stable phase, then decay over the last decay_ratio of steps.
struct LrSchedulerSection {
  int64_t warmup_steps = 200;
  std::optional<double> decay_ratio;  ///< unset: decay over all steps after warmup
  std::string decay_type = "linear";  ///< linear | sqrt | cosine
  double min_lr_factor = 0.0;         ///< final lr = lr * min_lr_factor
};

/// [training]
struct TrainingSection {
  std::string dataset = "data/brown.h5";  ///< HDF5 token store written by `meshtrain data prepare`
  int64_t local_batch_size = 8;           ///< samples per rank per micro-batch
  int64_t global_batch_size = -1;         ///< samples per step over all dp ranks; -1 = local × dp
  int64_t seq_len = 2048;                 ///< tokens per sample (targets are the next seq_len tokens)
  double max_norm = 1.0;                  ///< global gradient-norm clip; <= 0 disables
  int64_t steps = 10000;
  int64_t seed = 0;
  std::string device = "cpu";                     ///< cpu (fp32 reference) | cuda (one GPU per rank)
  std::string mixed_precision_param = "float32";   ///< forward/backward dtype: float32 | bfloat16 (cuda)
  std::string mixed_precision_reduce = "float32";  ///< gradient reduction dtype: float32 | bfloat16
  /// Cap on the memory each rank's device allocator may hold, GiB (0: the device's own memory):
  /// an allocation past it stops the run with an out-of-memory error naming this key.
  double memory_limit_gib = 0;
  /// Hardware catalog entry or file of train's start-up prediction (plan/hardware.hpp); "" =
  /// "cpu" for device cpu, "h100_sxm" for cuda.
  std::string hardware;
  /// Steps in a row whose loss or gradient norm is NaN / inf that are skipped (no optimizer
  /// update, logged) before the run stops; 0 = stop at the first (Megatron skips fp16 overflow).
  int64_t skip_nonfinite_steps = 0;
};

/// [parallelism]: mesh degrees (outer to inner: pp, dp_replicate, dp_shard, cp, tp).
struct ParallelismSection {
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;  ///< -1 fills world / (other degrees)
  int64_t tensor_parallel_degree = 1;
  int64_t pipeline_parallel_degree = 1;
  /// Pipeline stages (TorchTitan's split, parallel/pipeline/stage_split.hpp): the embedding
  /// counts as first_stage_less_layers blocks of the first stage, norm + output as
  /// last_stage_less_layers blocks of the last one.
  int64_t pipeline_parallel_first_stage_less_layers = 1;
  int64_t pipeline_parallel_last_stage_less_layers = 1;
  /// Blocks per stage; sets the number of stages ⌈(n_layers + first + last) / K⌉. Unset
  /// (TorchTitan's None): 1 stage per rank for GPipe / 1F1B, 2 for the multi-stage schedules.
  std::optional<int64_t> pipeline_parallel_layers_per_stage;
  /// Schedule by TorchTitan's name (parallel/pipeline/schedule.hpp, schedule_names()).
  std::string pipeline_parallel_schedule = "1F1B";
  /// CSV file of every rank's action list (parallel/pipeline/schedule_csv.hpp); "" = generate
  /// the schedule. When set, the actions come from the file, while pipeline_parallel_schedule
  /// still sets the stages per rank and their placement (TorchTitan v0.2.2's pipeline_llm).
  std::string pipeline_parallel_schedule_csv;
  /// Samples per pipeline micro-batch; micro-batches per round m = local_batch_size / this.
  int64_t pipeline_parallel_microbatch_size = 1;
  /// cp > 1: each sample's tokens are split over the cp group (context parallelism).
  int64_t context_parallel_degree = 1;
  /// How the sequence is cut into 2·cp chunks (TorchTitan's key): "headtail" gives cp rank i
  /// chunks i and 2·cp − 1 − i, so every rank does the same causal attention work; "none"
  /// gives rank i the contiguous chunks 2i and 2i + 1.
  std::string context_parallel_load_balancer = "headtail";
  /// How attention crosses the cp ranks: "allgather" (K/V gathered once, TorchTitan's
  /// default), "alltoall" (a ring of cp − 1 K/V hops overlapped with the block computation),
  /// "ulysses" (all-to-all from sequence shards to head shards and back).
  std::string context_parallel_rotate_method = "allgather";
  int64_t expert_parallel_degree = 1;
  /// Sharded data parallelism over the dp_shard group (Rajbhandari et al. 2020, ZeRO): 1 shards
  /// the optimizer state, 2 also the gradients, 3 also the parameters (= FSDP).
  int64_t zero_stage = 3;
  /// FSDP: free a unit's all-gathered parameters after its forward ("default" = "always" when
  /// pp == 1, TorchTitan's rule) and gather them again for its backward; "never" keeps them.
  std::string fsdp_reshard_after_forward = "default";
  /// tp > 1: shard the residual stream and norms along the tokens between tensor-parallel
  /// regions (all-gather / reduce-scatter, Korthikanti et al. 2022); false: all-reduce.
  bool enable_sequence_parallel = true;
  /// tp > 1: gather the logits for the loss instead of the vocab-parallel cross-entropy
  /// (TorchTitan's key).
  bool disable_loss_parallel = false;
  /// tp > 1 with sequence parallelism: the blocks' all-gather → column-parallel matmuls and
  /// row-parallel matmul → reduce-scatter run as tp ring steps, each step's transfer overlapped
  /// with the matmul of the block already here (TorchTitan's async TP; model/async_tensor_parallel.hpp).
  bool enable_async_tensor_parallel = false;
};

/// [activation_checkpoint]
struct ActivationCheckpointSection {
  std::string mode = "none";               ///< none | selective | full
  std::string selective_ac_option = "2";   ///< integer N: checkpoint every N-th block; "op": per operator
};

/// [metrics]
struct MetricsSection {
  int64_t log_freq = 10;  ///< steps between metric lines (the first and last step always log)
  bool enable_tensorboard = false;  ///< TensorBoard event files with the log line's scalars
  std::string save_tb_folder = "tb";  ///< inside dump_folder (an absolute path is used as is)
  bool save_for_all_ranks = false;  ///< every rank writes its own event file (rank_<R>/), not only rank 0
  int64_t moe_histogram_freq = 100;  ///< MoE: full tokens-per-expert histogram every N steps (at logged steps; 0 = never)
};

/// [profiling]: Chrome trace JSON of the executor's units and the collectives (TorchTitan's keys).
struct ProfilingSection {
  bool enable_profiling = false;
  std::string save_traces_folder = "profile_traces";  ///< inside dump_folder: iteration_<step>/rank<R>_trace.json
  int64_t profile_freq = 10;      ///< a trace every profile_freq steps
  int64_t profiler_warmup = 3;    ///< steps before a traced window that are not recorded (torch.profiler's warmup)
  int64_t profiler_active = 1;    ///< consecutive steps recorded at the end of each profile_freq window
};

/// [debug]: fault injection for tests (TorchTitan has a [debug] section).
struct DebugSection {
  /// Step whose gradient is made NaN on rank inject_nonfinite_grad_rank after backward, before
  /// the data-parallel reduction (-1 = never): tests the non-finite guard.
  int64_t inject_nonfinite_grad_step = -1;
  int64_t inject_nonfinite_grad_rank = 0;  ///< world rank that poisons its gradient
  int64_t inject_nonfinite_grad_count = 1;  ///< consecutive steps poisoned, from inject_nonfinite_grad_step
  /// MoE routing ignores the router's choice: token at sequence position t goes to experts
  /// (t·top_k + j) % num_experts, j < top_k (TorchTitan's key; balanced, layout-independent).
  bool moe_force_load_balance = false;
};

/// [validation]
struct ValidationSection {
  bool enable = false;
  int64_t freq = 500;   ///< steps between validations (and after the last step)
  int64_t steps = -1;   ///< global batches per validation; -1 = the whole validation split
};

/// [checkpoint]: sharded HDF5 checkpoints, resume and elastic restart (doc/checkpoint-format.md).
struct CheckpointSection {
  bool enable = false;
  std::string folder = "checkpoints";
  int64_t interval = 500;
  int64_t keep_latest_k = 0;
  int64_t load_step = -1;
  /// A checkpoint that fails to load: "fail" stops the run; "previous" falls back to the newest
  /// older checkpoint that loads (load_step = -1 only) and says so.
  std::string on_corrupt = "fail";
  /// The save after the last step holds parameters only (no optimizer state): smaller, for
  /// export and evaluation; training cannot resume from it (TorchTitan's key).
  bool last_save_model_only = false;
  /// Where a run with no checkpoint in `folder` yet starts from (TorchTitan's key): a meshtrain
  /// checkpoint file (step-NNNNNNNN.h5), a checkpoint folder (its `latest`), or with
  /// initial_load_in_hf a Hugging Face model folder. Ignored once `folder` holds a checkpoint, so
  /// a restarted job resumes its own state. "" = none.
  std::string initial_load_path;
  /// Read only the parameters from initial_load_path (the optimizer, step and data cursor start
  /// afresh); false resumes its whole training state (TorchTitan's key).
  bool initial_load_model_only = true;
  /// initial_load_path is a Hugging Face model folder (config.json + safetensors); without
  /// initial_load_path, [model] hf_assets_path is that folder (TorchTitan's key).
  bool initial_load_in_hf = false;
  /// The last save is also written as a Hugging Face model folder (model.safetensors,
  /// config.json, the hf_assets_path tokenizer files) in <checkpoint folder>/step-NNNNNNNN-hf
  /// (TorchTitan's key; needs enable and last_save_model_only).
  bool last_save_in_hf = false;
  /// Element type of that folder's tensors: "float32", "bfloat16" or "float16" (TorchTitan's key).
  std::string export_dtype = "float32";
  /// "disabled": a save blocks until the file is published; "async" / "async_with_pinned_mem"
  /// (TorchTitan's names): the save copies the state to host memory and a background thread
  /// writes and publishes the file while training continues (checkpoint/async_checkpoint.hpp).
  std::string async_mode = "disabled";
};

/// [comm]: collective deadlines enforced by the watchdog (TorchTitan's key names).
struct CommSection {
  double init_timeout_seconds = 300;   ///< until the first step completes (start-up, first collectives)
  double train_timeout_seconds = 100;  ///< afterwards, per collective
};

/// [topology]: where ranks sit (rack-aware placement); see doc/architecture.md.
struct TopologySection {
  std::string file;             ///< Slurm topology.conf (tree plugin); "" = none
  int64_t ranks_per_node = 8;   ///< simulated placement (`meshtrain layout`) when no MPI launch
  int64_t nodes_per_rack = 0;   ///< synthetic racks of this many nodes; 0 = all in one rack
  bool allow_cross_node_tp = false;  ///< permit tensor-parallel groups that span nodes
  bool simulate = false;        ///< place ranks on synthetic nodes of ranks_per_node (tests, rehearsals)
};

/// Degrees after validate(): every -1 resolved, product == world size.
struct ParallelDims {
  int64_t dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, pp = 1, ep = 1;
  int64_t dp() const { return dp_replicate * dp_shard; }
  int64_t world() const { return pp * dp_replicate * dp_shard * cp * tp; }
};

/// One deck + overrides, typed. Built by load_job_config() (deck_parser.hpp).
struct JobConfig {
  JobSection job;
  ModelSection model;
  OptimizerSection optimizer;
  LrSchedulerSection lr_scheduler;
  TrainingSection training;
  ParallelismSection parallelism;
  ActivationCheckpointSection activation_checkpoint;
  MetricsSection metrics;
  ValidationSection validation;
  CheckpointSection checkpoint;
  TopologySection topology;
  CommSection comm;
  ProfilingSection profiling;
  DebugSection debug;

  /// Values of the TorchTitan keys that have no meshtrain field ("section.key" -> value as TOML),
  /// as set by the deck or the command line (option_registry.hpp, Option::torchtitan_only).
  std::map<std::string, std::string> torchtitan;
  /// One line per key that is accepted but has no effect here, in deck order:
  /// `FILE:LINE: [section] key: why`. `meshtrain train` and `deck check` print them once.
  std::vector<std::string> notices;
  /// One line per key whose value meshtrain cannot honour (`not implemented yet`, or why the
  /// value means nothing here), in deck order; validate() throws the first, validate_layout()
  /// does not look at them.
  std::vector<std::string> refusals;

  std::string deck_path;  ///< the deck file as given ("" when built in code)
  /// "section.key" -> "FILE:LINE" (deck) or "command line" (override), for error messages.
  std::vector<std::pair<std::string, std::string>> origins;

  /// Where key "section.key" was set: "FILE:LINE", "command line", or the deck path if unset.
  std::string origin_of(const std::string& dotted_key) const;

  /// The model shape: flavor table entry of (model.name, model.flavor) with [model] overrides.
  /// @throws ConfigError unknown name/flavor, naming the key's origin. The last [model] section
  /// resolved is remembered per thread (the planner asks a million times for one model).
  ModelArgs model_args() const;
  /// model_args().n_layers (transformer blocks) without copying the arguments: the pipeline
  /// split asks once per validate(). @throws ConfigError as model_args().
  int64_t model_layers() const;
  /// model_args() without the memo: the flavor table, the overrides and their checks.
  /// @throws ConfigError as model_args().
  ModelArgs resolve_model_args() const;

  /// Checks every cross-key rule for a run on `world_size` ranks and resolves the degrees:
  /// dp_replicate × dp_shard × cp × tp × pp == world_size (dp_shard = -1 fills),
  /// n_heads % tp, n_kv_heads % tp, n_heads % n_kv_heads, seq_len % (2·cp) when cp > 1,
  /// global_batch % (local_batch × dp), num_experts % ep, MoE requires pp = 1, the pipeline
  /// stage split, and with pp > 1 the whole pipeline_plan() (schedule, micro-batches, CSV); degrees
  /// and options not implemented yet are rejected with "not implemented yet", and so is the first
  /// of `refusals` (TorchTitan keys, doc/torchtitan-compat.md).
  /// @throws ConfigError `FILE:LINE: [section] key: what is wrong (rule)`.
  ParallelDims validate(int64_t world_size) const;
  /// The arithmetic and model-compatibility rules of validate() only (no "not implemented yet"
  /// checks, no pipeline schedule or micro-batch rule, only its stage split): what `meshtrain
  /// layout` needs to lay out any published configuration.
  /// @throws ConfigError as validate().
  ParallelDims validate_layout(int64_t world_size) const;
  /// Sequence parallelism's token split, as validate_layout() checks it after the degrees, the
  /// heads and seq_len % (2·cp): with tp > 1 and enable_sequence_parallel, seq_len % (2·cp·tp)
  /// == 0 when cp > 1 and (seq_len / cp) % tp == 0 (each rank's tokens shard evenly over tp).
  /// True without sequence parallelism or tp. Throws nothing.
  bool sequence_split_holds(const ParallelDims& dims) const;

  /// The pipeline plan of a validated run (config/pipeline_plan.hpp): the schedule (generated
  /// from pipeline_parallel_schedule, or read from pipeline_parallel_schedule_csv), the stage
  /// split and the micro-batches per round. pp == 1: one stage holding the whole model, one
  /// micro-batch of local_batch_size samples and an empty schedule. validate() calls it.
  /// @throws ConfigError `FILE:LINE: [parallelism] key: rule` for local_batch_size not divisible
  ///         by the micro-batch size, a schedule rule (1F1B: m ≥ pp, ...), a stage count that
  ///         does not divide by pp or that the model cannot fill, and a CSV file that is missing,
  ///         does not parse or validate, or disagrees with the deck's pp, stages or m.
  PipelinePlan pipeline_plan(const ParallelDims& dims) const;
  /// The same checks; `with_schedule` false leaves plan.schedule empty (validate() needs only
  /// the verdict; generated schedules are made once per (name, pp, m, stages per rank) and
  /// process, then reused).
  PipelinePlan pipeline_plan(const ParallelDims& dims, bool with_schedule) const;
  /// The stage split alone, [pp × stages per rank] (no schedule, no batch rule): what
  /// validate_layout() checks. @throws ConfigError as pipeline_plan() for the split rules.
  std::vector<StageLayers> pipeline_stages(const ParallelDims& dims) const;

  /// Gradient-accumulation steps per optimizer step: global_batch / (local_batch × dp).
  int64_t grad_accum_steps(const ParallelDims& dims) const;
  /// global_batch_size with -1 resolved to local_batch × dp.
  int64_t global_batch(const ParallelDims& dims) const;
  /// Resolved output folder: job.dump_folder, or checkpoint/<deck file stem>/.
  std::string dump_folder() const;
};

}  // namespace meshtrain
