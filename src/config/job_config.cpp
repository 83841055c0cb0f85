#include "config/job_config.hpp"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <tuple>

#include "config/option_registry.hpp"
#include "config/pipeline_plan.hpp"
#include "config/toml_value.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

// Every validation message: `ORIGIN: [section] key: what is wrong (rule)`, ORIGIN being where
// the key was set (deck line or command line) so the user edits the right place.
[[noreturn]] void fail(const JobConfig& c, const std::string& dotted, const std::string& what) {
  throw ConfigError(c.origin_of(dotted) + ": " + key_label(dotted) + what);
}

// TorchTitan v0.2.2's models and flavors that meshtrain does not have (torchtitan/models/*/
// __init__.py): named so that a TorchTitan preset gets "not implemented yet", not "unknown".
const char* torchtitan_model_feature(const std::string& name) {
  if (name == "deepseek_v3" || name == "llama4" || name == "gpt_oss") return "Mixture-of-Experts model";
  if (name == "flux") return "diffusion model";
  if (name == "llama3_ft") return "fault-tolerant (torchft) model";
  if (name == "vlm") return "vision-language model";
  return nullptr;
}

// TorchTitan v0.2.2's attention flavors of llama3 (torchtitan/models/llama3/__init__.py): the
// shape of `base` with attn_type `attn_type` and attn_mask_type "block_causal". They resolve
// here rather than in the flavor table, so `meshtrain model list` keeps one row per shape.
struct AttentionFlavor {
  const char *flavor, *base, *attn_type;
};
const AttentionFlavor* torchtitan_attention_flavor(const std::string& name, const std::string& flavor) {
  static const AttentionFlavor table[] = {{"debugmodel_flex_attn", "debugmodel", "flex"},
                                          {"debugmodel_varlen_attn", "debugmodel", "varlen"},
                                          {"8B_flex", "8B", "flex"},
                                          {"8B_varlen", "8B", "varlen"}};
  if (name != "llama3") return nullptr;
  for (const AttentionFlavor& f : table)
    if (flavor == f.flavor) return &f;
  return nullptr;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

std::string JobConfig::origin_of(const std::string& dotted_key) const {
  for (const auto& [k, where] : origins)
    if (k == dotted_key) return where;
  return deck_path.empty() ? std::string("deck") : deck_path;  // a default: the deck is where to set it
}

namespace {
// The arguments depend on [model] alone. validate() and the pipeline split ask for them once
// per call, and `meshtrain plan` validates a million configurations of one model: the last
// section that resolved is remembered per thread (errors are not cached: they rethrow with this
// deck's key origins). The reference stays valid until this thread resolves another section.
const ModelArgs& memo_model_args(const JobConfig& c) {
  struct Last {
    bool set = false;
    ModelSection section;
    ModelArgs args;
  };
  thread_local Last last;
  if (last.set && last.section == c.model) return last.args;
  ModelArgs a = c.resolve_model_args();
  last.set = false;  // until both are assigned
  last.section = c.model;
  last.args = std::move(a);
  last.set = true;
  return last.args;
}
}  // namespace

ModelArgs JobConfig::model_args() const { return memo_model_args(*this); }

int64_t JobConfig::model_layers() const { return memo_model_args(*this).n_layers; }

ModelArgs JobConfig::resolve_model_args() const {
  const auto names = model_names();
  if (const char* what = torchtitan_model_feature(model.name))
    fail(*this, "model.name", std::string(what) + " '" + model.name + "' (TorchTitan) is not implemented yet (models: " +
                                  join(names) + ")");
  if (std::find(names.begin(), names.end(), model.name) == names.end())
    fail(*this, "model.name", "unknown model '" + model.name + "' (models: " + join(names) + ")");
  const AttentionFlavor* attention_flavor = torchtitan_attention_flavor(model.name, model.flavor);
  ModelArgs a;
  try {
    a = model_flavor(model.name, attention_flavor ? attention_flavor->base : model.flavor);
    if (attention_flavor) {
      a.flavor = model.flavor;
      a.attn_type = attention_flavor->attn_type;
      a.attn_mask_type = "block_causal";
    }
  } catch (const std::out_of_range&) {
    fail(*this, "model.flavor", "unknown flavor '" + model.flavor + "' of model '" + model.name + "' (flavors: " +
                                    join(model_flavors(model.name)) + ")");
  }
  const ModelArgs flavor = a;
  const ModelSection& m = model;
  if (m.dim) a.dim = *m.dim;
  if (m.n_layers) a.n_layers = *m.n_layers;
  if (m.n_heads) a.n_heads = *m.n_heads;
  if (m.n_kv_heads) a.n_kv_heads = *m.n_kv_heads;
  else if (m.n_heads && flavor.n_kv_heads == flavor.n_heads)
    a.n_kv_heads = *m.n_heads;  // a flavor without grouped-query attention keeps n_kv_heads = n_heads
  if (m.vocab_size) a.vocab_size = *m.vocab_size;
  if (m.multiple_of) a.multiple_of = *m.multiple_of;
  if (m.ffn_dim_multiplier) a.ffn_dim_multiplier = *m.ffn_dim_multiplier;
  if (m.ffn_hidden_dim) a.ffn_hidden_dim = *m.ffn_hidden_dim;
  if (m.norm_eps) a.norm_eps = *m.norm_eps;
  if (m.rope_theta) a.rope_theta = *m.rope_theta;
  if (m.qk_norm) a.qk_norm = *m.qk_norm;
  if (m.tie_word_embeddings) a.tie_word_embeddings = *m.tie_word_embeddings;
  if (m.use_rope_scaling) a.use_rope_scaling = *m.use_rope_scaling;
  if (m.rope_scaling_factor) a.rope_scaling_factor = *m.rope_scaling_factor;
  if (m.rope_low_freq_factor) a.rope_low_freq_factor = *m.rope_low_freq_factor;
  if (m.rope_high_freq_factor) a.rope_high_freq_factor = *m.rope_high_freq_factor;
  if (m.rope_original_max_seq_len) a.rope_original_max_seq_len = *m.rope_original_max_seq_len;
  if (m.num_experts) a.num_experts = *m.num_experts;
  if (m.top_k) a.top_k = *m.top_k;
  if (m.num_shared_experts) a.num_shared_experts = *m.num_shared_experts;
  if (m.moe_inter_dim) a.moe_inter_dim = *m.moe_inter_dim;
  if (!m.score_func.empty()) a.score_func = m.score_func;
  if (m.route_norm) a.route_norm = *m.route_norm;
  if (m.route_scale) a.route_scale = *m.route_scale;
  if (m.load_balance_coeff) a.load_balance_coeff = *m.load_balance_coeff;
  if (m.aux_loss_coeff) a.aux_loss_coeff = *m.aux_loss_coeff;
  if (m.z_loss_coeff) a.z_loss_coeff = *m.z_loss_coeff;
  if (m.n_dense_layers) a.n_dense_layers = *m.n_dense_layers;
  if (m.moe_layer_step) a.moe_layer_step = *m.moe_layer_step;
  a.output_z_loss_coeff = m.output_z_loss_coeff;
  a.loss_chunk_tokens = m.loss_chunk_tokens;
  if (a.loss_chunk_tokens % ModelArgs::kLossChunkMultiple)
    fail(*this, "model.loss_chunk_tokens",
         "loss_chunk_tokens " + str(a.loss_chunk_tokens) + " is not a multiple of " + str(ModelArgs::kLossChunkMultiple) +
             " (chunks are whole blocks of the output head's GEMMs, so chunked and unchunked losses agree bitwise); "
             "0 = unchunked");
  if (!m.attn_type.empty()) a.attn_type = m.attn_type;
  if (!m.attn_mask_type.empty()) a.attn_mask_type = m.attn_mask_type;
  if (a.attn_type == "varlen" && a.attn_mask_type != "block_causal")  // TorchTitan's get_attention_masks
    fail(*this, m.attn_mask_type.empty() ? "model.attn_type" : "model.attn_mask_type",
         "attn_type \"varlen\" needs attn_mask_type \"block_causal\", got \"" + a.attn_mask_type +
             "\" (variable-length attention is document attention)");
  if (a.num_experts > 0) {
    if (a.top_k > a.num_experts)
      fail(*this, m.top_k ? "model.top_k" : "model.num_experts",
           "top_k " + str(a.top_k) + " exceeds num_experts " + str(a.num_experts) +
               " (each token chooses top_k distinct experts)");
    if (a.moe_inter_dim < 1)
      fail(*this, m.moe_inter_dim ? "model.moe_inter_dim" : "model.num_experts",
           "a Mixture-of-Experts model (num_experts " + str(a.num_experts) +
               ") needs moe_inter_dim >= 1 (the experts' hidden width)");
    if (a.num_moe_layers() == 0)
      fail(*this, m.n_dense_layers ? "model.n_dense_layers" : "model.moe_layer_step",
           "no block is MoE: n_dense_layers " + str(a.n_dense_layers) + " and moe_layer_step " +
               str(a.moe_layer_step) + " leave all " + str(a.n_layers) + " blocks dense (set num_experts = 0 for a dense model)");
  }
  if (m.head_dim) {
    a.head_dim = *m.head_dim;
  } else if (a.name == "llama3" || a.name == "mixtral") {  // head_dim = dim / n_heads; Qwen3 sets it explicitly
    if (a.dim % a.n_heads)
      fail(*this, m.dim ? "model.dim" : "model.n_heads",
           "dim " + str(a.dim) + " is not divisible by n_heads " + str(a.n_heads) +
               " (head_dim = dim / n_heads; or set head_dim)");
    a.head_dim = a.dim / a.n_heads;
  }
  if (a.head_dim % 2)
    fail(*this, m.head_dim ? "model.head_dim" : (m.dim ? "model.dim" : "model.n_heads"),
         "head_dim " + str(a.head_dim) + " is odd (RoPE rotates pairs of channels)");
  if (a.use_rope_scaling && a.rope_high_freq_factor <= a.rope_low_freq_factor)
    fail(*this, m.rope_high_freq_factor ? "model.rope_high_freq_factor" : "model.rope_low_freq_factor",
         "rope_high_freq_factor " + toml::format_float(a.rope_high_freq_factor) + " must exceed rope_low_freq_factor " +
             toml::format_float(a.rope_low_freq_factor) + " (Llama 3.1 RoPE scaling)");
  return a;
}

int64_t JobConfig::global_batch(const ParallelDims& d) const {
  return training.global_batch_size < 0 ? training.local_batch_size * d.dp() : training.global_batch_size;
}

int64_t JobConfig::grad_accum_steps(const ParallelDims& d) const {
  return global_batch(d) / (training.local_batch_size * d.dp());
}

std::string JobConfig::dump_folder() const {
  if (!job.dump_folder.empty()) return job.dump_folder;
  const std::string stem = deck_path.empty() ? "run" : std::filesystem::path(deck_path).stem().string();
  return (std::filesystem::path("checkpoint") / stem).string();
}

bool JobConfig::sequence_split_holds(const ParallelDims& d) const {
  if (d.tp <= 1 || !parallelism.enable_sequence_parallel) return true;
  const int64_t t = training.seq_len;
  return !(d.cp > 1 && t % (2 * d.cp * d.tp)) && (t / d.cp) % d.tp == 0;
}

ParallelDims JobConfig::validate_layout(int64_t world_size) const {
  if (world_size < 1) throw ConfigError("world size " + str(world_size) + " must be >= 1");
  const ParallelismSection& p = parallelism;
  ParallelDims d;
  d.dp_replicate = p.data_parallel_replicate_degree;
  d.tp = p.tensor_parallel_degree;
  d.pp = p.pipeline_parallel_degree;
  d.cp = p.context_parallel_degree;
  d.ep = p.expert_parallel_degree;
  const int64_t others = d.dp_replicate * d.cp * d.tp * d.pp;
  // Formatted only on failure: the planner validates a million layouts.
  auto product = [&] {
    return "dp_replicate " + str(d.dp_replicate) + " × cp " + str(d.cp) + " × tp " + str(d.tp) + " × pp " + str(d.pp);
  };
  const char* rule = " (dp_replicate × dp_shard × cp × tp × pp == world size)";
  if (p.data_parallel_shard_degree == -1) {
    if (world_size % others)
      fail(*this, "parallelism.data_parallel_shard_degree",
           "-1 cannot fill world size " + str(world_size) + ": it is not divisible by " + product() + " = " + str(others) +
               rule);
    d.dp_shard = world_size / others;
  } else {
    d.dp_shard = p.data_parallel_shard_degree;
    if (d.world() != world_size)
      fail(*this, "parallelism.data_parallel_shard_degree",
           product() + " × dp_shard " + str(d.dp_shard) + " = " + str(d.world()) + " but the world size is " +
               str(world_size) + rule);
  }

  const ModelArgs& a = memo_model_args(*this);
  if (a.n_heads % a.n_kv_heads)
    fail(*this, "model.n_kv_heads", "n_heads " + str(a.n_heads) + " is not divisible by n_kv_heads " + str(a.n_kv_heads) +
                                        " (grouped-query attention: n_heads % n_kv_heads == 0)");
  if (a.n_heads % d.tp)
    fail(*this, "parallelism.tensor_parallel_degree",
         "n_heads " + str(a.n_heads) + " is not divisible by tp " + str(d.tp) + " (n_heads % tp == 0)");
  if (a.n_kv_heads % d.tp)
    fail(*this, "parallelism.tensor_parallel_degree",
         "n_kv_heads " + str(a.n_kv_heads) + " is not divisible by tp " + str(d.tp) + " (n_kv_heads % tp == 0)");
  if (d.cp > 1 && training.seq_len % (2 * d.cp))
    fail(*this, "training.seq_len", "seq_len " + str(training.seq_len) + " is not divisible by 2·cp = " +
                                        str(2 * d.cp) + " (zigzag context parallelism: seq_len % (2·cp) == 0)");
  if (!sequence_split_holds(d)) {
    if (d.cp > 1 && training.seq_len % (2 * d.cp * d.tp))
      fail(*this, "training.seq_len", "seq_len " + str(training.seq_len) + " is not divisible by 2·cp·tp = " +
                                          str(2 * d.cp * d.tp) + " (each cp chunk's tokens are sharded over tp by "
                                          "sequence parallelism; [parallelism] enable_sequence_parallel = false lifts "
                                          "the rule)");
    fail(*this, "training.seq_len", "seq_len / cp = " + str(training.seq_len / d.cp) + " is not divisible by tp " +
                                        str(d.tp) + " (sequence parallelism shards each sample's tokens over tp; "
                                        "[parallelism] enable_sequence_parallel = false lifts the rule)");
  }
  if (d.cp > 1 && p.context_parallel_rotate_method == "ulysses")
    for (auto [what, heads] : {std::pair{"n_heads", a.n_heads}, std::pair{"n_kv_heads", a.n_kv_heads}})
      if (heads % (d.cp * d.tp))
        fail(*this, "parallelism.context_parallel_rotate_method",
             std::string("\"ulysses\" gives each cp rank a share of every tp rank's heads, but ") + what + " " +
                 str(heads) + " is not divisible by cp × tp = " + str(d.cp * d.tp) + " (" + what +
                 " % (cp × tp) == 0; \"allgather\" or \"alltoall\" have no such rule)");
  // Vocabulary rows and FFN hidden units (of the dense blocks, and of a MoE block's shared
  // experts) split as torch.chunk does (⌈E/tp⌉ per rank): every rank must get at least one. The
  // routed experts are whole on every tp rank.
  const bool dense_blocks = a.num_moe_layers() < a.n_layers;
  const int64_t shared = a.num_moe_layers() > 0 ? a.num_shared_experts * a.moe_inter_dim : 0;
  for (auto [key, what, extent] : {std::tuple{"model.vocab_size", "vocab_size", a.vocab_size},
                                   std::tuple{"model.ffn_hidden_dim", "ffn_dim", dense_blocks ? a.ffn_dim() : 0},
                                   std::tuple{"model.num_shared_experts", "num_shared_experts × moe_inter_dim", shared}})
    if (d.tp > 1 && extent > 0 && (d.tp - 1) * ((extent + d.tp - 1) / d.tp) >= extent)
      fail(*this, key, std::string(what) + " " + str(extent) + " leaves tp rank " + str(d.tp - 1) + " of " +
                           str(d.tp) + " nothing to hold (split in chunks of ceil(" + what + " / tp) rows)");
  if (d.pp > 1) pipeline_stages(d);  // TorchTitan's split: every stage needs a share of the model
  if (d.ep > 1 && a.num_experts == 0)
    fail(*this, "parallelism.expert_parallel_degree",
         "expert parallelism needs a Mixture-of-Experts model ([model] num_experts > 0, num_experts % ep == 0)");
  if (d.ep > 1 && (d.dp_shard * d.cp) % d.ep)
    fail(*this, "parallelism.expert_parallel_degree",
         "ep " + str(d.ep) + " does not divide dp_shard × cp = " + str(d.dp_shard) + " × " + str(d.cp) +
             " (expert-parallel ranks are borrowed from the fsdp group, as in TorchTitan: (dp_shard × cp) % ep == 0)");
  if (d.ep > 1 && a.num_experts % d.ep)
    fail(*this, "parallelism.expert_parallel_degree",
         "num_experts " + str(a.num_experts) + " is not divisible by ep " + str(d.ep) +
             " (each ep rank holds num_experts / ep experts)");
  if (debug.moe_force_load_balance && a.num_experts == 0)
    fail(*this, "debug.moe_force_load_balance", "needs a Mixture-of-Experts model ([model] num_experts > 0)");
  const int64_t per_micro = training.local_batch_size * d.dp();
  if (training.global_batch_size > 0 && training.global_batch_size % per_micro)
    fail(*this, "training.global_batch_size",
         str(training.global_batch_size) + " is not divisible by local_batch_size × dp = " +
             str(training.local_batch_size) + " × " + str(d.dp()) +
             " (global_batch_size % (local_batch_size × dp) == 0; the quotient is gradient accumulation)");
  return d;
}

ParallelDims JobConfig::validate(int64_t world_size) const {
  const ParallelDims d = validate_layout(world_size);
  if (!refusals.empty()) throw ConfigError(refusals.front());
  if (parallelism.zero_stage < 3 && d.dp_shard * d.cp == 1)
    fail(*this, "parallelism.zero_stage",
         "ZeRO-" + str(parallelism.zero_stage) + " shards over the fsdp group (dp_shard × cp), but data_parallel_shard_degree "
         "and context_parallel_degree are 1 (zero_stage 1 or 2 needs dp_shard × cp > 1; plain DDP needs no zero_stage)");
  if (parallelism.zero_stage < 3 && parallelism.fsdp_reshard_after_forward != "default")
    fail(*this, "parallelism.fsdp_reshard_after_forward",
         "\"" + parallelism.fsdp_reshard_after_forward + "\" applies to sharded parameters (zero_stage 3), but zero_stage is " +
             str(parallelism.zero_stage) + " (parameters stay replicated)");
  // The plan's own rules first, so that a pp deck that could never run says why.
  if (d.pp > 1) pipeline_plan(d, false);
  if (training.mixed_precision_param == "bfloat16" && training.device != "cuda")
    fail(*this, "training.mixed_precision_param",
         "bfloat16 needs [training] device = \"cuda\" (the cpu device is the float32 reference)");
  if (checkpoint.last_save_in_hf && !(checkpoint.enable && checkpoint.last_save_model_only))
    fail(*this, "checkpoint.last_save_in_hf",
         "needs [checkpoint] enable = true and last_save_model_only = true (a Hugging Face folder holds the model "
         "only, written from the model-only last save)");
  if (checkpoint.initial_load_in_hf && !checkpoint.initial_load_model_only)
    fail(*this, "checkpoint.initial_load_model_only",
         "must be true with initial_load_in_hf = true (a Hugging Face model folder holds no optimizer or training state)");
  if (checkpoint.initial_load_in_hf && checkpoint.initial_load_path.empty() && model.hf_assets_path.empty())
    fail(*this, "checkpoint.initial_load_in_hf",
         "needs the Hugging Face model folder: set [checkpoint] initial_load_path or [model] hf_assets_path");
  const std::string& opt = activation_checkpoint.selective_ac_option;
  const auto n = toml::parse_int(opt);
  if (opt != "op" && (!n || *n < 1))
    fail(*this, "activation_checkpoint.selective_ac_option",
         "'" + opt + "' must be a positive integer N (checkpoint every N-th block)");
  return d;
}

}  // namespace meshtrain
