#include "config/job_config.hpp"

#include <filesystem>
#include <stdexcept>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

[[noreturn]] void fail(const JobConfig& c, const std::string& dotted, const std::string& what) {
  const size_t dot = dotted.find('.');
  throw ConfigError(c.origin_of(dotted) + ": [" + dotted.substr(0, dot) + "] " + dotted.substr(dot + 1) + ": " + what);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

ModelArgs JobConfig::model_args() const {
  ModelArgs a;
  try {
    a = model_flavor(model.name, model.flavor);
  } catch (const std::out_of_range&) {
    fail(*this, "model.flavor", "unknown flavor '" + model.flavor + "' of model '" + model.name + "' (flavors: " +
                                    join(model_flavors(model.name)) + ")");
  }
  const ModelSection& m = model;
  if (m.dim) a.dim = *m.dim;
  if (m.n_layers) a.n_layers = *m.n_layers;
  if (m.n_heads) a.n_heads = *m.n_heads;
  if (m.n_kv_heads) a.n_kv_heads = *m.n_kv_heads;
  else if (m.n_heads && a.name == "llama3" && a.n_kv_heads == model_flavor(m.name, m.flavor).n_heads)
    a.n_kv_heads = *m.n_heads;  // a flavor without GQA keeps n_kv_heads = n_heads
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
  if (m.head_dim) {
    a.head_dim = *m.head_dim;
  } else if (a.name == "llama3") {
    if (a.dim % a.n_heads) fail(*this, m.dim ? "model.dim" : "model.n_heads",
                                "dim " + std::to_string(a.dim) + " is not divisible by n_heads " +
                                    std::to_string(a.n_heads) + " (head_dim = dim / n_heads)");
    a.head_dim = a.dim / a.n_heads;
  }
  if (a.head_dim % 2) fail(*this, "model.head_dim", "head_dim " + std::to_string(a.head_dim) + " must be even (RoPE rotates pairs)");
  if (m.use_rope_scaling && a.rope_high_freq_factor <= a.rope_low_freq_factor)
    fail(*this, "model.rope_high_freq_factor", "must be greater than rope_low_freq_factor");
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

ParallelDims JobConfig::validate_layout(int64_t world_size) const {
  const ParallelismSection& p = parallelism;
  ParallelDims d;
  d.dp_replicate = p.data_parallel_replicate_degree;
  d.tp = p.tensor_parallel_degree;
  d.pp = p.pipeline_parallel_degree;
  d.cp = p.context_parallel_degree;
  d.ep = p.expert_parallel_degree;
  const int64_t others = d.dp_replicate * d.cp * d.tp * d.pp;
  const std::string product = "dp_replicate " + std::to_string(d.dp_replicate) + " × cp " + std::to_string(d.cp) +
                              " × tp " + std::to_string(d.tp) + " × pp " + std::to_string(d.pp);
  if (p.data_parallel_shard_degree == -1) {
    if (world_size % others)
      fail(*this, "parallelism.data_parallel_shard_degree",
           "-1 cannot fill world size " + std::to_string(world_size) + ": it is not divisible by " + product + " = " +
               std::to_string(others) + " (dp_replicate × dp_shard × cp × tp × pp == world size)");
    d.dp_shard = world_size / others;
  } else {
    d.dp_shard = p.data_parallel_shard_degree;
    if (d.world() != world_size)
      fail(*this, "parallelism.data_parallel_shard_degree",
           product + " × dp_shard " + std::to_string(d.dp_shard) + " = " + std::to_string(d.world()) +
               " but the world size is " + std::to_string(world_size) + " (dp_replicate × dp_shard × cp × tp × pp == world size)");
  }

  const ModelArgs a = model_args();
  if (a.n_heads % a.n_kv_heads)
    fail(*this, "model.n_kv_heads", "n_heads " + std::to_string(a.n_heads) + " is not divisible by n_kv_heads " +
                                        std::to_string(a.n_kv_heads) + " (grouped-query attention)");
  if (a.n_heads % d.tp)
    fail(*this, "parallelism.tensor_parallel_degree", "n_heads " + std::to_string(a.n_heads) +
                                                          " is not divisible by tp " + std::to_string(d.tp) + " (n_heads % tp == 0)");
  if (a.n_kv_heads % d.tp)
    fail(*this, "parallelism.tensor_parallel_degree", "n_kv_heads " + std::to_string(a.n_kv_heads) +
                                                          " is not divisible by tp " + std::to_string(d.tp) + " (n_kv_heads % tp == 0)");
  if (d.cp > 1 && training.seq_len % (2 * d.cp))
    fail(*this, "training.seq_len", "seq_len " + std::to_string(training.seq_len) + " is not divisible by 2·cp = " +
                                        std::to_string(2 * d.cp) + " (zigzag context parallelism)");
  if (d.pp > a.n_layers)
    fail(*this, "parallelism.pipeline_parallel_degree", "pp " + std::to_string(d.pp) + " exceeds n_layers " +
                                                            std::to_string(a.n_layers) + " (each stage needs a layer)");
  // Dense models have no experts: any ep > 1 has nothing to shard (num_experts % ep, MoE needs pp = 1).
  if (d.ep > 1)
    fail(*this, "parallelism.expert_parallel_degree",
         "expert parallelism needs a Mixture-of-Experts model (num_experts % ep == 0); MoE is not implemented yet");
  const int64_t per_micro = training.local_batch_size * d.dp();
  if (training.global_batch_size > 0 && training.global_batch_size % per_micro)
    fail(*this, "training.global_batch_size",
         std::to_string(training.global_batch_size) + " is not divisible by local_batch_size × dp = " +
             std::to_string(training.local_batch_size) + " × " + std::to_string(d.dp()) +
             " (global_batch_size % (local_batch_size × dp) == 0)");
  return d;
}

ParallelDims JobConfig::validate(int64_t world_size) const {
  const ParallelDims d = validate_layout(world_size);
  // Parsed, validated, but not implemented yet in this release.
  if (d.dp_shard > 1)
    fail(*this, "parallelism.data_parallel_shard_degree",
         "FSDP (dp_shard = " + std::to_string(d.dp_shard) +
             ") is not implemented yet; use data_parallel_replicate_degree = world size for data parallelism");
  if (d.tp > 1) fail(*this, "parallelism.tensor_parallel_degree", "tensor parallelism is not implemented yet");
  if (d.pp > 1) fail(*this, "parallelism.pipeline_parallel_degree", "pipeline parallelism is not implemented yet");
  if (d.cp > 1) fail(*this, "parallelism.context_parallel_degree", "context parallelism is not implemented yet");
  if (checkpoint.enable) fail(*this, "checkpoint.enable", "checkpointing is not implemented yet");
  if (training.mixed_precision_param != "float32")
    fail(*this, "training.mixed_precision_param", "bfloat16 parameters are not implemented yet (CPU backend is fp32)");
  if (training.mixed_precision_reduce != "float32")
    fail(*this, "training.mixed_precision_reduce", "bfloat16 reduction is not implemented yet (CPU backend is fp32)");
  if (activation_checkpoint.mode == "selective") {
    const std::string& opt = activation_checkpoint.selective_ac_option;
    if (opt == "op") fail(*this, "activation_checkpoint.selective_ac_option", "\"op\" (per-operator selective AC) is not implemented yet; use an integer N");
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(opt, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != opt.size() || n < 1)
      fail(*this, "activation_checkpoint.selective_ac_option", "'" + opt + "' must be a positive integer N (checkpoint every N-th block)");
  }
  return d;
}

}  // namespace meshtrain
