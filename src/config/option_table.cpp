// The registry's entries: every field of every JobConfig section, in reference order. Key names,
// defaults and meanings follow TorchTitan's job config (torchtitan/config/job_config.py) where it
// has the key; the ranges are what the code below `config/` relies on.
#include <algorithm>
#include <type_traits>

#include "config/option_table.hpp"
#include "config/toml_value.hpp"
#include "parallel/pipeline/schedule.hpp"

namespace meshtrain {

namespace {

using Bound = std::optional<double>;

// Bounds print as people write them: "0", "1", "0.5".
std::string bound_text(double v) {
  return v == double(int64_t(v)) ? std::to_string(int64_t(v)) : toml::format_float(v);
}

// "> 0", "in [0, 1)", ">= 1 or -1": the human-readable form of an option's numeric range.
std::string range_text(const Option& o) {
  std::string t;
  if (o.min && o.max)
    t = std::string("in ") + (o.min_exclusive ? "(" : "[") + bound_text(*o.min) + ", " +
        bound_text(*o.max) + (o.max_exclusive ? ")" : "]");
  else if (o.min)
    t = (o.min_exclusive ? "> " : ">= ") + bound_text(*o.min);
  else if (o.max)
    t = (o.max_exclusive ? "< " : "<= ") + bound_text(*o.max);
  for (int64_t a : o.also_allowed) t += (t.empty() ? "" : " or ") + std::to_string(a);
  return t.empty() ? "any" : t;
}

// Adds the entries of one section; each method binds one field of `S` (reached through `sec`).
template <class S>
struct Section {
  std::vector<Option>& out;
  std::string name;
  S JobConfig::*sec;

  Option& add(Option o, const char* key, OptionType type, std::string doc) {
    o.section = name;
    o.key = key;
    o.type = type;
    o.doc = std::move(doc);
    out.push_back(std::move(o));
    return out.back();
  }

  /// A string; `choices` empty = free text described by `allowed`.
  Option& str(const char* key, std::string S::*f, std::string doc, std::vector<std::string> choices = {},
              std::string allowed = "any") {
    Option o;
    o.choices = choices;
    o.allowed = choices.empty() ? allowed : "";
    for (size_t i = 0; i < choices.size(); ++i) o.allowed += (i ? " | " : "") + choices[i];
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.text; };
    o.get = [s, f](const JobConfig& c) { return toml::quote((c.*s).*f); };
    o.default_text = toml::quote(JobConfig{}.*s.*f);
    return add(std::move(o), key, OptionType::kString, std::move(doc));
  }

  Option& integer(const char* key, int64_t S::*f, std::string doc, Bound min = {}, Bound max = {},
                  std::vector<int64_t> also = {}) {
    Option o;
    o.type = OptionType::kInt;
    o.min = min;
    o.max = max;
    o.also_allowed = std::move(also);
    o.allowed = range_text(o);
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.i; };
    o.get = [s, f](const JobConfig& c) { return std::to_string((c.*s).*f); };
    o.default_text = std::to_string(JobConfig{}.*s.*f);
    return add(std::move(o), key, OptionType::kInt, std::move(doc));
  }

  Option& real(const char* key, double S::*f, std::string doc, Bound min = {}, bool min_excl = false, Bound max = {},
               bool max_excl = false) {
    Option o;
    o.type = OptionType::kFloat;
    o.min = min;
    o.min_exclusive = min_excl;
    o.max = max;
    o.max_exclusive = max_excl;
    o.allowed = range_text(o);
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.f; };
    o.get = [s, f](const JobConfig& c) { return toml::format_float((c.*s).*f); };
    o.default_text = toml::format_float(JobConfig{}.*s.*f);
    return add(std::move(o), key, OptionType::kFloat, std::move(doc));
  }

  Option& boolean(const char* key, bool S::*f, std::string doc) {
    Option o;
    o.allowed = "true | false";
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.b; };
    o.get = [s, f](const JobConfig& c) { return std::string((c.*s).*f ? "true" : "false"); };
    o.default_text = (JobConfig{}.*s.*f) ? "true" : "false";
    return add(std::move(o), key, OptionType::kBool, std::move(doc));
  }

  /// An optional field: unset keeps `unset_text`'s meaning ("(flavor)": the flavor's value).
  template <class T>
  Option& optional(const char* key, std::optional<T> S::*f, std::string doc, const char* unset_text, Bound min = {},
                   bool min_excl = false, Bound max = {}) {
    constexpr OptionType type = std::is_same_v<T, bool>      ? OptionType::kBool
                                : std::is_same_v<T, int64_t> ? OptionType::kInt
                                                             : OptionType::kFloat;
    Option o;
    o.type = type;
    o.min = min;
    o.min_exclusive = min_excl;
    o.max = max;
    o.allowed = type == OptionType::kBool ? "true | false" : range_text(o);
    o.default_text = unset_text;
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) {
      if constexpr (type == OptionType::kBool) (c.*s).*f = v.b;
      else if constexpr (type == OptionType::kInt) (c.*s).*f = v.i;
      else (c.*s).*f = v.f;
    };
    o.get = [s, f](const JobConfig& c) -> std::string {
      const auto& x = (c.*s).*f;
      if (!x) return "";
      if constexpr (type == OptionType::kBool) return *x ? "true" : "false";
      else if constexpr (type == OptionType::kInt) return std::to_string(*x);
      else return toml::format_float(*x);
    };
    return add(std::move(o), key, type, std::move(doc));
  }
};

// selective_ac_option: "op" or a positive integer N (TorchTitan's two forms).
std::string selective_ac_rule(const OptionValue& v) {
  if (v.text == "op") return "";
  const auto n = toml::parse_int(v.text);
  return n && *n >= 1 ? "" : "must be a positive integer N or \"op\"";
}

}  // namespace

std::vector<Option> build_option_table() {
  std::vector<Option> o;
  {
    Section<JobSection> s{o, "job", &JobConfig::job};
    s.str("dump_folder", &JobSection::dump_folder,
          "run output folder (metrics.jsonl, deck.resolved.toml, checkpoints); \"\" = checkpoint/<deck file stem>/", {},
          "path");
    s.str("description", &JobSection::description, "free text describing the run; kept in deck.resolved.toml and in every checkpoint's /meta deck");
    s.boolean("final_dump", &JobSection::final_dump,
              "write model_final.h5 (a model-only checkpoint: every parameter, float32, written by the sharded writer) when the run ends; benchmarks turn it off");
    s.boolean("print_config", &JobSection::print_config,
              "rank 0 prints the resolved deck at start (`meshtrain train`, `meshtrain deck check`)");
  }
  {
    Section<ModelSection> s{o, "model", &JobConfig::model};
    // Free text checked by a rule rather than choices, so that TorchTitan's other models reach
    // JobConfig::model_args() and get "not implemented yet" instead of "not allowed".
    s.str("name", &ModelSection::name, "model family", {}, "llama3 | qwen3 | mixtral").rule = [](const OptionValue& v) {
      static const std::vector<std::string> known = {"llama3", "qwen3", "mixtral", "deepseek_v3", "llama4",
                                                     "gpt_oss", "flux",  "llama3_ft",   "vlm"};
      return std::find(known.begin(), known.end(), v.text) != known.end() ? "" : std::string("must be one of llama3 | qwen3 | mixtral");
    };
    s.str("flavor", &ModelSection::flavor,
          "published shape of the family (`meshtrain model list`); the [model] keys below override single fields", {},
          "a flavor of name");
    s.str("hf_assets_path", &ModelSection::hf_assets_path,
          "folder of Hugging Face assets: `meshtrain data prepare --hf-assets-path` reads its tokenizer.model, "
          "`meshtrain ckpt export` copies its tokenizer files; training does not read it; \"\" = none",
          {}, "path");
    const char* F = "(flavor)";
    s.optional("dim", &ModelSection::dim, "model width D", F, 1);
    s.optional("n_layers", &ModelSection::n_layers, "number of transformer blocks", F, 1);
    s.optional("n_heads", &ModelSection::n_heads, "query heads; n_heads % n_kv_heads == 0", F, 1);
    s.optional("n_kv_heads", &ModelSection::n_kv_heads,
               "key/value heads (grouped-query attention when < n_heads; llama3: follows n_heads when unset and the flavor has no GQA)",
               F, 1);
    s.optional("head_dim", &ModelSection::head_dim, "per-head width, even (RoPE); llama3 default dim / n_heads", F, 2);
    s.optional("vocab_size", &ModelSection::vocab_size, "vocabulary size; must cover the dataset's tokenizer", F, 1);
    s.optional("multiple_of", &ModelSection::multiple_of, "FFN width rounded up to a multiple of this (llama3)", F, 1);
    s.optional("ffn_dim_multiplier", &ModelSection::ffn_dim_multiplier,
               "FFN width multiplier applied to 2·4D/3 before rounding (llama3)", F, 0.0, true);
    s.optional("ffn_hidden_dim", &ModelSection::ffn_hidden_dim, "explicit FFN width; overrides the llama3 formula (qwen3)", F, 1);
    s.optional("norm_eps", &ModelSection::norm_eps, "RMSNorm epsilon", F, 0.0, true);
    s.optional("rope_theta", &ModelSection::rope_theta, "RoPE base frequency", F, 0.0, true);
    s.optional("qk_norm", &ModelSection::qk_norm, "per-head RMSNorm on q and k (qwen3)", F);
    s.optional("tie_word_embeddings", &ModelSection::tie_word_embeddings, "output projection shares the token embedding", F);
    s.optional("use_rope_scaling", &ModelSection::use_rope_scaling, "Llama 3.1 RoPE frequency scaling", F);
    s.optional("rope_scaling_factor", &ModelSection::rope_scaling_factor, "RoPE scaling: context extension factor", F, 0.0, true);
    s.optional("rope_low_freq_factor", &ModelSection::rope_low_freq_factor, "RoPE scaling: low-frequency factor", F, 0.0, true);
    s.optional("rope_high_freq_factor", &ModelSection::rope_high_freq_factor,
               "RoPE scaling: high-frequency factor (> rope_low_freq_factor)", F, 0.0, true);
    s.optional("rope_original_max_seq_len", &ModelSection::rope_original_max_seq_len,
               "RoPE scaling: context length the model was pretrained with", F, 1);
    for (auto [key, field, meaning, choices] :
         {std::tuple{"attn_type", &ModelSection::attn_type,
                     "TorchTitan's attention backend name; meshtrain's own kernels serve all three (varlen needs "
                     "attn_mask_type = \"block_causal\")",
                     std::vector<std::string>{"sdpa", "flex", "varlen"}},
          std::tuple{"attn_mask_type", &ModelSection::attn_mask_type,
                     "causal, or block_causal: each token attends only to earlier tokens of its own document of the "
                     "packed sample (a document ends with its EOS token, the store's eos_id; RoPE keeps sample "
                     "positions)",
                     std::vector<std::string>{"causal", "block_causal"}}}) {
      s.str(key, field, meaning, choices);
      o.back().default_text = F;
      o.back().get = [field](const JobConfig& c) {  // unset ("") prints nothing, like the optional keys
        return (c.model.*field).empty() ? std::string() : toml::quote(c.model.*field);
      };
    }
    s.optional("num_experts", &ModelSection::num_experts,
               "routed experts per MoE block (Mixture of Experts; 0 = every block dense)", F, 0);
    s.optional("top_k", &ModelSection::top_k, "experts chosen per token (token choice, dropless); <= num_experts", F, 1);
    s.optional("num_shared_experts", &ModelSection::num_shared_experts,
               "always-on experts per MoE block (one SwiGLU FFN of num_shared_experts × moe_inter_dim)", F, 0);
    s.optional("moe_inter_dim", &ModelSection::moe_inter_dim, "hidden width of each routed and shared expert", F, 1);
    s.str("score_func", &ModelSection::score_func, "router scores: softmax over the experts or sigmoid per expert, in float32",
          {"softmax", "sigmoid"});
    o.back().default_text = F;
    o.back().get = [](const JobConfig& c) {  // unset ("") prints nothing, like the optional keys
      return c.model.score_func.empty() ? std::string() : toml::quote(c.model.score_func);
    };
    s.optional("route_norm", &ModelSection::route_norm, "renormalize the chosen gates to sum 1", F);
    s.optional("route_scale", &ModelSection::route_scale, "gates multiplied by this (after route_norm)", F, 0.0, true);
    s.optional("load_balance_coeff", &ModelSection::load_balance_coeff,
               "auxiliary-loss-free balancing (DeepSeek-V3): per-expert bias step per optimizer step; 0 = off", F, 0.0);
    s.optional("aux_loss_coeff", &ModelSection::aux_loss_coeff,
               "sequence-wise balance loss coefficient (DeepSeek-V3 eq. 17); 0 = off", F, 0.0);
    s.optional("z_loss_coeff", &ModelSection::z_loss_coeff,
               "MoE router z-loss coefficient (ST-MoE eq. 5, on the router's logits; output_z_loss_coeff is the output "
               "head's); 0 = off",
               F, 0.0);
    s.optional("n_dense_layers", &ModelSection::n_dense_layers,
               "the first n blocks keep the dense FFN (ffn_hidden_dim wide)", F, 0);
    s.optional("moe_layer_step", &ModelSection::moe_layer_step,
               "after the dense ones, block i is MoE when i % moe_layer_step == moe_layer_step - 1 (1 = all)", F, 1);
    s.real("output_z_loss_coeff", &ModelSection::output_z_loss_coeff,
           "PaLM's z-loss on the output logits (Chowdhery et al. 2022, section 5): output_z_loss_coeff * log(Z)^2 "
           "per token, Z = sum exp(logits), added to the training loss and its gradient and reported as z_loss in "
           "metrics.jsonl (loss stays the plain cross-entropy); PaLM uses 1e-4; 0 = off (the MoE router's is "
           "z_loss_coeff)",
           0.0);
    s.integer("loss_chunk_tokens", &ModelSection::loss_chunk_tokens,
              "chunked cross-entropy: the output head's GEMMs and the loss run over chunks of this many tokens, so "
              "the logits buffer is [chunk, vocab / tp] instead of [tokens, vocab / tp]; backward recomputes each "
              "chunk's logits (one more head GEMM); a multiple of 256, losses and gradients bitwise equal to the "
              "unchunked head on CPU; 0 = unchunked",
              0);
  }
  {
    Section<OptimizerSection> s{o, "optimizer", &JobConfig::optimizer};
    s.str("name", &OptimizerSection::name,
          "optimizer: AdamW (decoupled weight decay, Loshchilov & Hutter 2019), or Muon (Newton-Schulz "
          "orthogonalized momentum for the hidden weight matrices, Jordan et al. 2024; AdamW for the embedding, the "
          "output head and the norms); \"Adam\" is not implemented yet",
          {"AdamW", "Muon", "Adam"});
    s.real("lr", &OptimizerSection::lr, "peak learning rate (Muon: of the matrices, and of its AdamW group unless "
           "adamw_lr)", 0.0, true);
    s.real("beta1", &OptimizerSection::beta1, "AdamW first-moment decay", 0.0, false, 1.0, true);
    s.real("beta2", &OptimizerSection::beta2, "AdamW second-moment decay", 0.0, false, 1.0, true);
    s.real("eps", &OptimizerSection::eps, "AdamW epsilon added to the root of the second moment", 0.0, true);
    s.real("weight_decay", &OptimizerSection::weight_decay, "decoupled weight decay (multiplied by lr)", 0.0);
    s.boolean("decay_embeddings_and_norms", &OptimizerSection::decay_embeddings_and_norms,
              "also decay the embedding and the norm weights (off: matrices only)");
    s.real("muon_momentum", &OptimizerSection::muon_momentum,
           "Muon: momentum mu of M <- mu*M + (1-mu)*G (Megatron-Core's muon_momentum)", 0.0, false, 1.0, true);
    s.boolean("muon_use_nesterov", &OptimizerSection::muon_use_nesterov,
              "Muon: orthogonalize the Nesterov direction (1-mu)*G + mu*M instead of M");
    s.integer("muon_num_ns_steps", &OptimizerSection::muon_num_ns_steps,
              "Muon: Newton-Schulz iterations (quintic coefficients 3.4445, -4.7750, 2.0315)", 1, 20);
    s.str("muon_scale_mode", &OptimizerSection::muon_scale_mode,
          "Muon: update scale s(m, n) of an [m, n] matrix: spectral sqrt(max(m, n)), shape_scaling "
          "sqrt(max(1, m/n)), unit_rms_norm sqrt(m/n); times muon_extra_scale_factor",
          {"spectral", "shape_scaling", "unit_rms_norm"});
    s.real("muon_extra_scale_factor", &OptimizerSection::muon_extra_scale_factor,
           "Muon: factor on the update scale; 0.2 with spectral is Moonlight's match of AdamW's update RMS (Liu et "
           "al. 2025), so AdamW's lr and weight_decay carry over",
           0.0, true);
    s.optional("adamw_lr", &OptimizerSection::adamw_lr,
               "Muon: peak lr of the AdamW group (embedding, output head, norms), unset = lr; the schedule scales "
               "it like lr",
               "(unset)", 0.0, true);
    s.optional("adamw_weight_decay", &OptimizerSection::adamw_weight_decay,
               "Muon: weight decay of the AdamW group, unset = weight_decay (norms and embeddings still need "
               "decay_embeddings_and_norms)",
               "(unset)", 0.0);
  }
  {
    Section<LrSchedulerSection> s{o, "lr_scheduler", &JobConfig::lr_scheduler};
    s.integer("warmup_steps", &LrSchedulerSection::warmup_steps, "steps of linear warmup from 0 to lr", 0);
    s.optional("decay_ratio", &LrSchedulerSection::decay_ratio,
               "fraction of steps spent decaying, at the end (unset: every step after warmup decays)", "(unset)", 0.0,
               false, 1.0);
    s.str("decay_type", &LrSchedulerSection::decay_type, "shape of the decay", {"linear", "sqrt", "cosine"});
    s.real("min_lr_factor", &LrSchedulerSection::min_lr_factor, "final lr as a fraction of lr", 0.0, false, 1.0);
  }
  {
    Section<TrainingSection> s{o, "training", &JobConfig::training};
    s.str("dataset", &TrainingSection::dataset, "HDF5 token store written by `meshtrain data prepare`", {}, "path");
    s.integer("local_batch_size", &TrainingSection::local_batch_size, "samples per rank per micro-batch", 1);
    s.integer("global_batch_size", &TrainingSection::global_batch_size,
              "samples per optimizer step over all dp ranks (-1 = local_batch_size × dp); a multiple of local × dp, the "
              "quotient being gradient accumulation",
              1, {}, {-1});
    s.integer("seq_len", &TrainingSection::seq_len, "tokens per sample", 1);
    s.real("max_norm", &TrainingSection::max_norm, "global gradient-norm clip (<= 0 disables clipping)");
    s.integer("steps", &TrainingSection::steps, "optimizer steps", 1);
    s.integer("seed", &TrainingSection::seed, "seed of initialization and sample order", 0);
    s.str("device", &TrainingSection::device,
          "where each rank computes: cpu (fp32 reference, OpenBLAS) or cuda (one GPU per rank, node-local rank "
          "modulo the visible GPUs)",
          {"cpu", "cuda"});
    s.str("mixed_precision_param", &TrainingSection::mixed_precision_param,
          "parameter and activation dtype in forward and backward; master weights and AdamW state stay float32 "
          "(bfloat16 needs device = cuda)",
          {"float32", "bfloat16"});
    s.str("mixed_precision_reduce", &TrainingSection::mixed_precision_reduce,
          "dtype in which data-parallel gradients are reduced (summed into float32 gradients either way)",
          {"float32", "bfloat16"});
    s.str("hardware", &TrainingSection::hardware,
          "hardware catalog entry (inputs/hardware/catalog.toml: a100_40gb, a100_80gb, h100_sxm, h100_pcie, h100_nvl, h200, "
          "b200, gb200, cpu) or catalog file whose prediction of memory and step time train prints at start-up, "
          "warning when the predicted peak exceeds the device; \"\" = cpu for device cpu, h100_sxm for cuda");
    s.real("memory_limit_gib", &TrainingSection::memory_limit_gib,
           "cap on each rank's device memory (its allocator's reserved bytes), GiB: an allocation past it stops the "
           "run with an out-of-memory error; 0 = the device's own memory (a CPU node's share per rank, a smaller "
           "GPU)",
           0.0);
    s.integer("skip_nonfinite_steps", &TrainingSection::skip_nonfinite_steps,
              "steps in a row with a NaN / inf loss or gradient norm that are skipped (no update) before the run stops "
              "with status 5; 0 = stop at the first",
              0);
  }
  {
    Section<ParallelismSection> s{o, "parallelism", &JobConfig::parallelism};
    s.integer("data_parallel_replicate_degree", &ParallelismSection::data_parallel_replicate_degree,
              "data-parallel replicas (DDP; HSDP with dp_shard > 1)", 1);
    s.integer("data_parallel_shard_degree", &ParallelismSection::data_parallel_shard_degree,
              "FSDP / ZeRO shard group size (-1 = world / the other degrees)", 1, {}, {-1});
    s.integer("tensor_parallel_degree", &ParallelismSection::tensor_parallel_degree,
              "tensor-parallel degree: column / row parallel attention and FFN, vocab-parallel embedding and output", 1);
    s.integer("pipeline_parallel_degree", &ParallelismSection::pipeline_parallel_degree,
              "pipeline-parallel ranks: the model is cut into stages, one or more per rank (the "
              "pipeline_parallel_* keys below)",
              1);
    s.integer("pipeline_parallel_first_stage_less_layers", &ParallelismSection::pipeline_parallel_first_stage_less_layers,
              "pp > 1: the embedding counts as this many blocks when the blocks are split over the stages "
              "(the first stage gets fewer)",
              0);
    s.integer("pipeline_parallel_last_stage_less_layers", &ParallelismSection::pipeline_parallel_last_stage_less_layers,
              "pp > 1: norm + output count as this many blocks when the blocks are split over the stages "
              "(the last stage gets fewer)",
              0);
    s.optional("pipeline_parallel_layers_per_stage", &ParallelismSection::pipeline_parallel_layers_per_stage,
               "pp > 1: blocks per stage; the stages number ceil((n_layers + first_stage_less_layers + "
               "last_stage_less_layers) / this), a multiple of pp (unset: 1 per rank, 2 for the multi-stage schedules)",
               "(unset)", 1);
    s.str("pipeline_parallel_schedule", &ParallelismSection::pipeline_parallel_schedule,
          "pp > 1: order of the micro-batches' forwards and backwards on each rank (doc/parallelism.md); also "
          "sets the stages per rank and their placement when pipeline_parallel_schedule_csv gives the actions",
          schedule_names());
    s.str("pipeline_parallel_schedule_csv", &ParallelismSection::pipeline_parallel_schedule_csv,
          "pp > 1: CSV file of every rank's actions (one line per rank: 0F0,0F1,0B0,...) used instead of "
          "generating pipeline_parallel_schedule's; \"\" = generate",
          {}, "path");
    s.integer("pipeline_parallel_microbatch_size", &ParallelismSection::pipeline_parallel_microbatch_size,
              "pp > 1: samples per micro-batch; local_batch_size / this micro-batches per pipeline round", 1);
    s.integer("context_parallel_degree", &ParallelismSection::context_parallel_degree,
              "context-parallel degree: each sample's seq_len tokens are split over cp ranks (2·cp chunks); "
              "parameters are then sharded over dp_shard × cp (FSDP)", 1);
    s.str("context_parallel_load_balancer", &ParallelismSection::context_parallel_load_balancer,
          "cp > 1: which of the 2·cp chunks each cp rank holds: headtail = chunks i and 2·cp − 1 − i (equal causal "
          "work per rank), none = the contiguous chunks 2i, 2i + 1",
          {"headtail", "none"});
    s.str("context_parallel_rotate_method", &ParallelismSection::context_parallel_rotate_method,
          "cp > 1: how attention crosses the cp ranks: allgather = K/V all-gathered once per layer; alltoall = a "
          "ring passing K/V shards cp − 1 hops, overlapped with the block computation; ulysses = all-to-all from "
          "sequence shards to head shards (n_heads and n_kv_heads divisible by cp × tp)",
          {"allgather", "alltoall", "ulysses"});
    s.integer("expert_parallel_degree", &ParallelismSection::expert_parallel_degree,
              "expert-parallel degree, MoE only: ep ranks borrowed from dp_shard × cp (which ep divides), each "
              "holding num_experts / ep experts sharded over the rest; float32 only for now", 1);
    s.integer("zero_stage", &ParallelismSection::zero_stage,
              "what dp_shard > 1 shards: 1 optimizer state (ZeRO-1), 2 + gradients (ZeRO-2), 3 + parameters (FSDP)", 1, 3);
    s.str("fsdp_reshard_after_forward", &ParallelismSection::fsdp_reshard_after_forward,
          "FSDP: free gathered parameters after each unit's forward and re-gather them for backward "
          "(default = always when pp == 1)",
          {"default", "always", "never"});
    s.boolean("enable_sequence_parallel", &ParallelismSection::enable_sequence_parallel,
              "tp > 1: shard the residual stream and norms along the tokens (all-gather / reduce-scatter); "
              "false: replicate them (all-reduce)");
    s.boolean("disable_loss_parallel", &ParallelismSection::disable_loss_parallel,
              "tp > 1: all-gather the logits for the loss instead of the vocab-parallel cross-entropy");
    s.boolean("enable_async_tensor_parallel", &ParallelismSection::enable_async_tensor_parallel,
              "tp > 1 with sequence parallelism: the blocks' all-gather + column-parallel matmuls and row-parallel "
              "matmul + reduce-scatter run as tp ring steps, each transfer overlapped with the matmul of a row block "
              "already received (async TP); the embedding, output head and routed experts keep the plain collectives");
  }
  {
    Section<ActivationCheckpointSection> s{o, "activation_checkpoint", &JobConfig::activation_checkpoint};
    s.str("mode", &ActivationCheckpointSection::mode,
          "activation checkpointing (recompute in backward); \"memory_budget\" is not implemented yet",
          {"none", "selective", "full", "memory_budget"});
    s.str("selective_ac_option", &ActivationCheckpointSection::selective_ac_option,
          "mode = selective: \"N\" recomputes every N-th block; \"op\" keeps attention, reduce-scatter / all-to-all "
          "and every second matmul of each block and recomputes the rest", {},
          "positive integer N | op")
        .rule = selective_ac_rule;
  }
  {
    Section<MetricsSection> s{o, "metrics", &JobConfig::metrics};
    s.integer("log_freq", &MetricsSection::log_freq, "steps between metric lines (the first and last step always log)", 1);
    s.boolean("enable_tensorboard", &MetricsSection::enable_tensorboard,
              "also write the log line's scalars as TensorBoard event files in save_tb_folder");
    s.str("save_tb_folder", &MetricsSection::save_tb_folder,
          "TensorBoard folder inside dump_folder (an absolute path is used as is)", {}, "path");
    s.boolean("save_for_all_ranks", &MetricsSection::save_for_all_ranks,
              "TensorBoard: every rank writes its own event file (save_tb_folder/rank_<R>), not only rank 0");
    s.integer("moe_histogram_freq", &MetricsSection::moe_histogram_freq,
              "MoE models: the full tokens-per-expert histogram of every MoE layer goes into metrics.jsonl at logged "
              "steps that are multiples of this (0 = never; min / max / cv are written at every logged step)",
              0);
  }
  {
    Section<ProfilingSection> s{o, "profiling", &JobConfig::profiling};
    s.boolean("enable_profiling", &ProfilingSection::enable_profiling,
              "write a Chrome trace (Perfetto, chrome://tracing) of every unit and collective every profile_freq steps");
    s.str("save_traces_folder", &ProfilingSection::save_traces_folder,
          "trace folder inside dump_folder: iteration_<step>/rank<R>_trace.json", {}, "path");
    s.integer("profile_freq", &ProfilingSection::profile_freq, "steps between traces", 1);
    s.integer("profiler_warmup", &ProfilingSection::profiler_warmup,
              "steps before each traced window that are run but not recorded (profiler_warmup + profiler_active <= profile_freq)",
              0);
    s.integer("profiler_active", &ProfilingSection::profiler_active,
              "consecutive steps recorded at the end of each profile_freq window", 1);
  }
  {
    Section<ValidationSection> s{o, "validation", &JobConfig::validation};
    s.boolean("enable", &ValidationSection::enable, "compute the validation loss during training");
    s.integer("freq", &ValidationSection::freq, "steps between validations (and after the last step)", 1);
    s.integer("steps", &ValidationSection::steps, "global batches per validation (-1 = the whole validation split)", 1, {},
              {-1});
  }
  {
    Section<CheckpointSection> s{o, "checkpoint", &JobConfig::checkpoint};
    s.boolean("enable", &CheckpointSection::enable, "save sharded HDF5 checkpoints every `interval` steps and at the last step; resume from `latest` at start");
    s.str("folder", &CheckpointSection::folder, "checkpoint folder inside dump_folder (an absolute path is used as is)", {}, "path");
    s.integer("interval", &CheckpointSection::interval, "steps between checkpoints", 1);
    s.integer("keep_latest_k", &CheckpointSection::keep_latest_k, "checkpoints kept (0 = all)", 0);
    s.integer("load_step", &CheckpointSection::load_step, "step to resume from (-1 = the latest)", -1);
    s.str("on_corrupt", &CheckpointSection::on_corrupt,
          "a checkpoint that fails to load (checksum, truncation, shape): fail, or fall back to the previous one",
          {"fail", "previous"});
    s.str("initial_load_path", &CheckpointSection::initial_load_path,
          "where a run whose checkpoint folder is still empty starts from: a checkpoint file, a checkpoint folder "
          "(its latest), or a Hugging Face model folder (initial_load_in_hf); \"\" = none",
          {}, "path");
    s.boolean("initial_load_model_only", &CheckpointSection::initial_load_model_only,
              "read only the parameters from initial_load_path (optimizer, step and data cursor start afresh); "
              "false resumes its whole training state");
    s.boolean("initial_load_in_hf", &CheckpointSection::initial_load_in_hf,
              "initial_load_path (or, unset, [model] hf_assets_path) is a Hugging Face model folder: config.json is "
              "checked against [model], the safetensors (bf16, fp16, fp32) become float32 masters in any layout");
    s.boolean("last_save_model_only", &CheckpointSection::last_save_model_only,
              "the save after the last step holds parameters only (no optimizer state; cannot be resumed from)");
    s.boolean("last_save_in_hf", &CheckpointSection::last_save_in_hf,
              "the last save is also written as a Hugging Face model folder <folder>/step-NNNNNNNN-hf (model.safetensors, "
              "config.json, [model] hf_assets_path's tokenizer files); needs last_save_model_only");
    s.str("export_dtype", &CheckpointSection::export_dtype,
          "element type of the last_save_in_hf folder's tensors (checkpoints themselves hold float32)",
          {"float32", "bfloat16", "float16"});
    s.str("async_mode", &CheckpointSection::async_mode,
          "disabled: a save blocks until the file is published; async, async_with_pinned_mem: the save copies the "
          "state to host memory, a background thread writes and publishes it while training continues (the next save "
          "and the end of the run wait for it)",
          {"disabled", "async", "async_with_pinned_mem"});
  }
  {
    Section<TopologySection> s{o, "topology", &JobConfig::topology};
    s.str("file", &TopologySection::file, "Slurm topology.conf (tree plugin) giving each node's top-of-rack switch; \"\" = none",
          {}, "path");
    s.integer("ranks_per_node", &TopologySection::ranks_per_node, "ranks per node when placement is simulated", 1);
    s.integer("nodes_per_rack", &TopologySection::nodes_per_rack, "synthetic racks of this many nodes (0 = one rack)", 0);
    s.boolean("allow_cross_node_tp", &TopologySection::allow_cross_node_tp, "allow tensor-parallel groups to span nodes");
    s.boolean("simulate", &TopologySection::simulate,
              "place ranks on synthetic nodes of ranks_per_node instead of the real hosts (tests, rehearsals)");
  }
  {
    Section<CommSection> s{o, "comm", &JobConfig::comm};
    s.real("init_timeout_seconds", &CommSection::init_timeout_seconds,
           "deadline of each collective until the first step completes; a missed one aborts the job", 0.0, true);
    s.real("train_timeout_seconds", &CommSection::train_timeout_seconds,
           "deadline of each collective after the first step", 0.0, true);
  }
  {
    Section<DebugSection> s{o, "debug", &JobConfig::debug};
    s.integer("inject_nonfinite_grad_step", &DebugSection::inject_nonfinite_grad_step,
              "fault injection: make this step's gradient NaN on one rank (-1 = never)", 1, {}, {-1});
    s.integer("inject_nonfinite_grad_rank", &DebugSection::inject_nonfinite_grad_rank,
              "fault injection: the world rank whose gradient is made NaN", 0);
    s.integer("inject_nonfinite_grad_count", &DebugSection::inject_nonfinite_grad_count,
              "fault injection: consecutive steps poisoned, from inject_nonfinite_grad_step", 1);
    s.boolean("moe_force_load_balance", &DebugSection::moe_force_load_balance,
              "MoE routing ignores the router: the token at sequence position t goes to experts (t·top_k + j) % "
              "num_experts (balanced; for tests and benchmarks)");
  }
  return o;
}

}  // namespace meshtrain
