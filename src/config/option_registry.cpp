#include "config/option_registry.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace meshtrain {

const char* option_type_name(OptionType t) {
  switch (t) {
    case OptionType::kString: return "string";
    case OptionType::kInt: return "integer";
    case OptionType::kFloat: return "float";
    case OptionType::kBool: return "boolean";
  }
  return "?";
}

std::string Option::check(const OptionValue& v) const {
  if (type == OptionType::kString) {
    if (choices.empty() || std::find(choices.begin(), choices.end(), v.text) != choices.end()) return "";
    return "must be one of " + allowed;
  }
  if (type == OptionType::kInt &&
      std::find(also_allowed.begin(), also_allowed.end(), v.i) != also_allowed.end())
    return "";
  const double x = type == OptionType::kInt ? double(v.i) : v.f;
  if (min && (x < *min || (min_exclusive && x == *min))) return "must be " + allowed;
  if (max && x > *max) return "must be " + allowed;
  return "";
}

namespace {

std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep TOML floats floats
  return s;
}
std::string quote(const std::string& s) { return "\"" + s + "\""; }

// Builders for one entry per field type; `F` is a pointer to the field inside a section.
template <class S>
struct Builder {
  std::vector<Option>& out;
  std::string section;
  S JobConfig::*sec;

  Option& add(Option o) {
    o.section = section;
    out.push_back(std::move(o));
    return out.back();
  }
  Option& str(const char* key, std::string S::*f, std::string doc, std::vector<std::string> choices = {}) {
    Option o;
    o.key = key;
    o.type = OptionType::kString;
    o.doc = std::move(doc);
    o.choices = choices;
    for (size_t i = 0; i < choices.size(); ++i) o.allowed += (i ? " | " : "") + choices[i];
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.text; };
    o.get = [s, f](const JobConfig& c) { return quote((c.*s).*f); };
    o.default_text = quote(JobConfig{}.*s.*f);
    return add(std::move(o));
  }
  Option& integer(const char* key, int64_t S::*f, std::string doc, std::optional<double> min = {},
                  std::optional<double> max = {}, std::vector<int64_t> also = {}) {
    Option o;
    o.key = key;
    o.type = OptionType::kInt;
    o.doc = std::move(doc);
    o.min = min;
    o.max = max;
    o.also_allowed = also;
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.i; };
    o.get = [s, f](const JobConfig& c) { return std::to_string((c.*s).*f); };
    o.default_text = std::to_string(JobConfig{}.*s.*f);
    o.allowed = range_text(o);
    return add(std::move(o));
  }
  Option& real(const char* key, double S::*f, std::string doc, std::optional<double> min = {},
               std::optional<double> max = {}, bool min_exclusive = false) {
    Option o;
    o.key = key;
    o.type = OptionType::kFloat;
    o.doc = std::move(doc);
    o.min = min;
    o.max = max;
    o.min_exclusive = min_exclusive;
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.f; };
    o.get = [s, f](const JobConfig& c) { return fmt_double((c.*s).*f); };
    o.default_text = fmt_double(JobConfig{}.*s.*f);
    o.allowed = range_text(o);
    return add(std::move(o));
  }
  Option& boolean(const char* key, bool S::*f, std::string doc) {
    Option o;
    o.key = key;
    o.type = OptionType::kBool;
    o.doc = std::move(doc);
    o.allowed = "true | false";
    auto s = sec;
    o.set = [s, f](JobConfig& c, const OptionValue& v) { (c.*s).*f = v.b; };
    o.get = [s, f](const JobConfig& c) { return std::string((c.*s).*f ? "true" : "false"); };
    o.default_text = (JobConfig{}.*s.*f) ? "true" : "false";
    return add(std::move(o));
  }
  // Optional overrides: unset means "keep the flavor's value".
  template <class T>
  Option& optional(const char* key, std::optional<T> S::*f, OptionType type, std::string doc,
                   std::optional<double> min = {}, bool min_exclusive = false) {
    Option o;
    o.key = key;
    o.type = type;
    o.doc = std::move(doc);
    o.min = min;
    o.min_exclusive = min_exclusive;
    o.default_text = "(unset)";
    o.allowed = type == OptionType::kBool ? "true | false" : range_text(o);
    auto s = sec;
    o.set = [s, f, type](JobConfig& c, const OptionValue& v) {
      if constexpr (std::is_same_v<T, bool>) (c.*s).*f = v.b;
      else if constexpr (std::is_same_v<T, int64_t>) (c.*s).*f = v.i;
      else (c.*s).*f = type == OptionType::kInt ? double(v.i) : v.f;
    };
    o.get = [s, f](const JobConfig& c) -> std::string {
      const auto& x = (c.*s).*f;
      if (!x) return "";
      if constexpr (std::is_same_v<T, bool>) return *x ? "true" : "false";
      else if constexpr (std::is_same_v<T, int64_t>) return std::to_string(*x);
      else return fmt_double(*x);
    };
    return add(std::move(o));
  }

  static std::string range_text(const Option& o) {
    auto num = [&](double v) { return o.type == OptionType::kInt ? std::to_string(int64_t(v)) : fmt_double(v); };
    std::string t;
    if (o.min && o.max) t = "in [" + num(*o.min) + ", " + num(*o.max) + "]";
    else if (o.min) t = (o.min_exclusive ? "> " : ">= ") + num(*o.min);
    else if (o.max) t = "<= " + num(*o.max);
    for (int64_t a : o.also_allowed) t += (t.empty() ? "" : " or ") + std::to_string(a);
    return t.empty() ? "any" : t;
  }
};

std::vector<Option> build() {
  std::vector<Option> o;
  {
    Builder<JobSection> b{o, "job", &JobConfig::job};
    b.str("dump_folder", &JobSection::dump_folder, "run output folder; empty = checkpoint/<deck file name>/");
    b.str("description", &JobSection::description, "free text describing the run");
  }
  {
    Builder<ModelSection> b{o, "model", &JobConfig::model};
    b.str("name", &ModelSection::name, "model family", {"llama3", "qwen3"});
    b.str("flavor", &ModelSection::flavor, "published shape (meshtrain model list); [model] keys below override it");
    using T = OptionType;
    b.optional("dim", &ModelSection::dim, T::kInt, "model width D", 1);
    b.optional("n_layers", &ModelSection::n_layers, T::kInt, "number of transformer blocks", 1);
    b.optional("n_heads", &ModelSection::n_heads, T::kInt, "query heads", 1);
    b.optional("n_kv_heads", &ModelSection::n_kv_heads, T::kInt, "key/value heads (grouped-query attention when < n_heads)", 1);
    b.optional("head_dim", &ModelSection::head_dim, T::kInt, "per-head width (default dim / n_heads for llama3)", 2);
    b.optional("vocab_size", &ModelSection::vocab_size, T::kInt, "vocabulary size (>= the dataset's)", 1);
    b.optional("multiple_of", &ModelSection::multiple_of, T::kInt, "FFN width rounded up to a multiple of this", 1);
    b.optional("ffn_dim_multiplier", &ModelSection::ffn_dim_multiplier, T::kFloat, "FFN width multiplier (Llama)", 0.0, true);
    b.optional("ffn_hidden_dim", &ModelSection::ffn_hidden_dim, T::kInt, "explicit FFN width (Qwen3)", 1);
    b.optional("norm_eps", &ModelSection::norm_eps, T::kFloat, "RMSNorm epsilon", 0.0, true);
    b.optional("rope_theta", &ModelSection::rope_theta, T::kFloat, "RoPE base", 0.0, true);
    b.optional("qk_norm", &ModelSection::qk_norm, T::kBool, "Qwen3 per-head RMSNorm on q and k");
    b.optional("tie_word_embeddings", &ModelSection::tie_word_embeddings, T::kBool, "output projection shares the embedding");
    b.optional("use_rope_scaling", &ModelSection::use_rope_scaling, T::kBool, "Llama 3.1 RoPE frequency scaling");
    b.optional("rope_scaling_factor", &ModelSection::rope_scaling_factor, T::kFloat, "RoPE scaling factor", 0.0, true);
    b.optional("rope_low_freq_factor", &ModelSection::rope_low_freq_factor, T::kFloat, "RoPE scaling low-frequency factor", 0.0, true);
    b.optional("rope_high_freq_factor", &ModelSection::rope_high_freq_factor, T::kFloat, "RoPE scaling high-frequency factor", 0.0, true);
    b.optional("rope_original_max_seq_len", &ModelSection::rope_original_max_seq_len, T::kInt, "RoPE scaling original context length", 1);
  }
  {
    Builder<OptimizerSection> b{o, "optimizer", &JobConfig::optimizer};
    b.str("name", &OptimizerSection::name, "optimizer", {"AdamW"});
    b.real("lr", &OptimizerSection::lr, "peak learning rate", 0.0, {}, true);
    b.real("beta1", &OptimizerSection::beta1, "AdamW beta1", 0.0, 0.999999);
    b.real("beta2", &OptimizerSection::beta2, "AdamW beta2", 0.0, 0.999999);
    b.real("eps", &OptimizerSection::eps, "AdamW epsilon", 0.0, {}, true);
    b.real("weight_decay", &OptimizerSection::weight_decay, "decoupled weight decay", 0.0);
    b.boolean("decay_embeddings_and_norms", &OptimizerSection::decay_embeddings_and_norms,
              "also decay embeddings and norm weights");
  }
  {
    Builder<LrSchedulerSection> b{o, "lr_scheduler", &JobConfig::lr_scheduler};
    b.integer("warmup_steps", &LrSchedulerSection::warmup_steps, "linear warmup steps", 0);
    b.optional("decay_ratio", &LrSchedulerSection::decay_ratio, OptionType::kFloat,
               "fraction of steps spent decaying (unset: all steps after warmup)", 0.0).max = 1.0;
    o.back().allowed = "in [0, 1]";
    b.str("decay_type", &LrSchedulerSection::decay_type, "decay shape", {"linear", "sqrt", "cosine"});
    b.real("min_lr_factor", &LrSchedulerSection::min_lr_factor, "final lr as a fraction of lr", 0.0, 1.0);
  }
  {
    Builder<TrainingSection> b{o, "training", &JobConfig::training};
    b.str("dataset", &TrainingSection::dataset, "HDF5 token store from `meshtrain data prepare`");
    b.integer("local_batch_size", &TrainingSection::local_batch_size, "samples per rank per micro-batch", 1);
    b.integer("global_batch_size", &TrainingSection::global_batch_size,
              "samples per optimizer step over all dp ranks (-1 = local × dp); the rest is gradient accumulation", 1, {}, {-1});
    b.integer("seq_len", &TrainingSection::seq_len, "tokens per sample", 1);
    b.real("max_norm", &TrainingSection::max_norm, "global gradient-norm clip (<= 0 disables)");
    b.integer("steps", &TrainingSection::steps, "optimizer steps", 1);
    b.integer("seed", &TrainingSection::seed, "seed of initialization and sample order", 0);
    b.str("mixed_precision_param", &TrainingSection::mixed_precision_param, "parameter dtype", {"float32", "bfloat16"});
    b.str("mixed_precision_reduce", &TrainingSection::mixed_precision_reduce, "gradient reduction dtype", {"float32", "bfloat16"});
  }
  {
    Builder<ParallelismSection> b{o, "parallelism", &JobConfig::parallelism};
    b.integer("data_parallel_replicate_degree", &ParallelismSection::data_parallel_replicate_degree,
              "DDP / HSDP replica groups", 1);
    b.integer("data_parallel_shard_degree", &ParallelismSection::data_parallel_shard_degree,
              "FSDP shard group size (-1 = fill the world)", 1, {}, {-1});
    b.integer("tensor_parallel_degree", &ParallelismSection::tensor_parallel_degree, "tensor parallel degree", 1);
    b.integer("pipeline_parallel_degree", &ParallelismSection::pipeline_parallel_degree, "pipeline stages", 1);
    b.integer("context_parallel_degree", &ParallelismSection::context_parallel_degree, "context parallel degree", 1);
    b.integer("expert_parallel_degree", &ParallelismSection::expert_parallel_degree, "expert parallel degree (MoE)", 1);
  }
  {
    Builder<ActivationCheckpointSection> b{o, "activation_checkpoint", &JobConfig::activation_checkpoint};
    b.str("mode", &ActivationCheckpointSection::mode, "activation checkpointing", {"none", "selective", "full"});
    b.str("selective_ac_option", &ActivationCheckpointSection::selective_ac_option,
          "selective: a positive integer N recomputes every N-th block (\"op\" not implemented yet)");
  }
  {
    Builder<MetricsSection> b{o, "metrics", &JobConfig::metrics};
    b.integer("log_freq", &MetricsSection::log_freq, "steps between metric lines", 1);
  }
  {
    Builder<ValidationSection> b{o, "validation", &JobConfig::validation};
    b.boolean("enable", &ValidationSection::enable, "compute validation loss");
    b.integer("freq", &ValidationSection::freq, "steps between validations (and at the end)", 1);
    b.integer("steps", &ValidationSection::steps, "global batches per validation (-1 = the whole validation split)", 1, {}, {-1});
  }
  {
    Builder<CheckpointSection> b{o, "checkpoint", &JobConfig::checkpoint};
    b.boolean("enable", &CheckpointSection::enable, "sharded HDF5 checkpoints (not implemented yet)");
    b.str("folder", &CheckpointSection::folder, "checkpoint folder inside dump_folder");
    b.integer("interval", &CheckpointSection::interval, "steps between checkpoints", 1);
    b.integer("keep_latest_k", &CheckpointSection::keep_latest_k, "checkpoints kept (0 = all)", 0);
    b.integer("load_step", &CheckpointSection::load_step, "step to resume from (-1 = latest)", -1);
  }
  {
    Builder<CommSection> b{o, "comm", &JobConfig::comm};
    b.real("init_timeout_seconds", &CommSection::init_timeout_seconds,
           "deadline of each collective until the first step completes; the job aborts when one passes", 0.0, {}, true);
    b.real("train_timeout_seconds", &CommSection::train_timeout_seconds,
           "deadline of each collective after the first step", 0.0, {}, true);
  }
  {
    Builder<TopologySection> b{o, "topology", &JobConfig::topology};
    b.str("file", &TopologySection::file, "Slurm topology.conf (tree plugin) giving each node's top-of-rack switch");
    b.integer("ranks_per_node", &TopologySection::ranks_per_node, "ranks per node when placement is simulated (meshtrain layout)", 1);
    b.integer("nodes_per_rack", &TopologySection::nodes_per_rack, "synthetic racks of this many nodes (0 = one rack)", 0);
    b.boolean("allow_cross_node_tp", &TopologySection::allow_cross_node_tp, "allow tensor-parallel groups to span nodes");
    b.boolean("simulate", &TopologySection::simulate,
              "place ranks on synthetic nodes of ranks_per_node instead of the real hosts (tests, rehearsals)");
  }
  return o;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

const std::vector<Option>& option_registry() {
  static const std::vector<Option> r = build();
  return r;
}

const Option* find_option(const std::string& dotted) {
  for (const Option& o : option_registry())
    if (o.dotted() == dotted) return &o;
  return nullptr;
}

std::string nearest_option(const std::string& dotted) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const Option& o : option_registry()) {
    // Compare within the section first: a misspelt key usually keeps its section.
    const size_t d = edit_distance(dotted, o.dotted());
    if (d < best_d) best_d = d, best = o.dotted();
  }
  return best;
}

std::vector<std::string> option_sections() {
  std::vector<std::string> s;
  for (const Option& o : option_registry())
    if (s.empty() || s.back() != o.section) s.push_back(o.section);
  return s;
}

}  // namespace meshtrain
