// The TorchTitan pass of load_job_config(): the TorchTitan keys that stand for a meshtrain field
// under another name, each set key's verdict, and the outcomes that depend on two keys.
#include <algorithm>
#include <filesystem>

#include "config/float8_config.hpp"
#include "config/toml_value.hpp"
#include "config/torchtitan_keys.hpp"

namespace meshtrain {

namespace {

class Pass {
 public:
  Pass(JobConfig& cfg, const std::vector<std::string>& set_keys) : cfg_(cfg), set_keys_(set_keys) {}

  bool is_set(const std::string& dotted) const {
    return std::find(set_keys_.begin(), set_keys_.end(), dotted) != set_keys_.end();
  }
  bool from_command_line(const std::string& dotted) const { return cfg_.origin_of(dotted) == "command line"; }

  /// The value of a set key, parsed again from the field (or JobConfig::torchtitan) it went to.
  OptionValue value(const std::string& dotted) const {
    const Option& o = *find_option(dotted);
    return parse_option_value(o, o.get(cfg_), ValueSyntax::kDeck);
  }

  void add(const std::string& dotted, const Verdict& v) {
    if (v.outcome == Outcome::kHonoured) return;
    const auto at = size_t(std::find(set_keys_.begin(), set_keys_.end(), dotted) - set_keys_.begin());
    const std::string line = cfg_.origin_of(dotted) + ": " + key_label(dotted) + v.why;
    (v.outcome == Outcome::kNotice ? notices_ : refusals_).emplace_back(at, line);
  }

  /// Lines in set-key order (a stable sort keeps a key's own lines in the order they were added).
  void finish() {
    for (auto* list : {&notices_, &refusals_}) {
      std::stable_sort(list->begin(), list->end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& entry : *list) (list == &notices_ ? cfg_.notices : cfg_.refusals).push_back(entry.second);
    }
  }

  JobConfig& cfg() { return cfg_; }

 private:
  JobConfig& cfg_;
  const std::vector<std::string>& set_keys_;
  std::vector<std::pair<size_t, std::string>> notices_, refusals_;
};

// [training] dataset_path is TorchTitan's token-store path; meshtrain's is [training] dataset.
void apply_dataset_path(Pass& p) {
  if (!p.is_set("training.dataset_path")) return;
  const std::string path = p.value("training.dataset_path").text;
  if (p.is_set("training.dataset") && p.from_command_line("training.dataset") &&
      !p.from_command_line("training.dataset_path")) {
    p.add("training.dataset_path", {Outcome::kNotice, "overridden by --training.dataset on the command line"});
    return;
  }
  if (p.is_set("training.dataset") && p.cfg().training.dataset != path)
    p.add("training.dataset", {Outcome::kNotice, "\"" + p.cfg().training.dataset +
                                                     "\" is only a name here: the token store is [training] "
                                                     "dataset_path \"" + path + "\""});
  p.cfg().training.dataset = path;
}

// A TorchTitan dataset name is downloaded by TorchTitan; meshtrain reads a prepared token store.
void check_dataset_name(Pass& p) {
  const std::string& d = p.cfg().training.dataset;
  std::error_code ec;
  if (!is_torchtitan_dataset_name(d) || std::filesystem::exists(d, ec)) return;
  p.add(p.is_set("training.dataset") ? "training.dataset" : "training.dataset_path",
        {Outcome::kRefused,
         "\"" + d + "\" is a Hugging Face dataset name (TorchTitan downloads it); meshtrain trains from a "
         "pre-tokenized token store: prepare one with `meshtrain data prepare --input TEXT... --output FILE.h5` and "
         "pass its path (dataset_path = \"FILE.h5\" in the deck, or --training.dataset=FILE.h5)"});
}

// [debug] seed is TorchTitan's name for the seed meshtrain keeps in [training] seed.
void apply_debug_seed(Pass& p) {
  if (!p.is_set("debug.seed")) return;
  const int64_t seed = p.value("debug.seed").i;
  if (p.is_set("training.seed") && p.cfg().training.seed != seed) {
    const bool cli_seed = p.from_command_line("training.seed"), cli_debug = p.from_command_line("debug.seed");
    if (cli_seed && !cli_debug) {
      p.add("debug.seed", {Outcome::kNotice, "overridden by --training.seed on the command line"});
      return;
    }
    if (cli_debug == cli_seed) {
      p.add("debug.seed", {Outcome::kRefused, std::to_string(seed) + " conflicts with [training] seed = " +
                                                  std::to_string(p.cfg().training.seed) + " (" +
                                                  p.cfg().origin_of("training.seed") + "); set one of them"});
      return;
    }
  }
  p.cfg().training.seed = seed;
}

// [model] tokenizer_path, TorchTitan's deprecated hf_assets_path (a tokenizer file or folder);
// then a missing assets folder: training does not need it, data prepare and export do.
void apply_hf_assets(Pass& p) {
  std::string key = p.is_set("model.hf_assets_path") ? "model.hf_assets_path" : "";
  if (p.is_set("model.tokenizer_path")) {
    if (!key.empty()) {
      p.add("model.tokenizer_path",
            {Outcome::kNotice, "TorchTitan's deprecated name of hf_assets_path; [model] hf_assets_path is used"});
    } else {
      std::filesystem::path t = p.value("model.tokenizer_path").text;
      std::error_code ec;
      p.cfg().model.hf_assets_path = std::filesystem::is_regular_file(t, ec) ? t.parent_path().string() : t.string();
      key = "model.tokenizer_path";
    }
  }
  std::error_code ec;
  const std::string& dir = p.cfg().model.hf_assets_path;
  if (!key.empty() && !dir.empty() && !std::filesystem::is_directory(dir, ec))
    p.add(key, {Outcome::kNotice, "\"" + dir + "\" is not a folder here; training reads the pre-tokenized token store "
                                  "([training] dataset), so the folder is only used by `meshtrain data prepare "
                                  "--hf-assets-path` and `meshtrain ckpt export`"});
}

void check_total_steps(Pass& p) {
  if (!p.is_set("lr_scheduler.total_steps")) return;
  const int64_t total = p.value("lr_scheduler.total_steps").i, steps = p.cfg().training.steps;
  if (total != steps)
    p.add("lr_scheduler.total_steps",
          {Outcome::kRefused, std::to_string(total) + " differs from [training] steps = " + std::to_string(steps) +
                                  ": a schedule longer or shorter than the run is not implemented yet (the schedule "
                                  "spans [training] steps)"});
}

void check_export_dtype(Pass& p) {
  if (!p.is_set("checkpoint.export_dtype")) return;
  const std::string dtype = p.value("checkpoint.export_dtype").text;
  if (dtype == "float32") return;
  if (p.cfg().checkpoint.last_save_model_only && !p.cfg().checkpoint.last_save_in_hf)
    p.add("checkpoint.export_dtype",
          {Outcome::kRefused, dtype + " for the HDF5 model-only last save is not implemented yet (meshtrain's "
                                      "checkpoints hold float32; with last_save_in_hf = true the Hugging Face folder "
                                      "is written in " + dtype + ")"});
  else if (!p.cfg().checkpoint.last_save_model_only)
    p.add("checkpoint.export_dtype",
          {Outcome::kNotice, "applies only when last_save_model_only = true (TorchTitan converts only a model-only "
                             "last save); meshtrain saves float32"});
}

// Validation runs at the training micro-batch shape.
void check_validation_shape(Pass& p) {
  const std::pair<const char*, int64_t> rules[] = {{"local_batch_size", p.cfg().training.local_batch_size},
                                                   {"seq_len", p.cfg().training.seq_len}};
  for (const auto& [key, training_value] : rules) {
    const std::string dotted = std::string("validation.") + key;
    if (!p.is_set(dotted)) continue;
    const int64_t v = p.value(dotted).i;
    if (v != training_value)
      p.add(dotted, {Outcome::kRefused, std::to_string(v) + " differs from [training] " + key + " = " +
                                            std::to_string(training_value) +
                                            ": validation at another shape is not implemented yet (it runs at the "
                                            "training micro-batch shape)"});
  }
}

// Float8 training (model.converters = ["float8"]) and its [quantize.linear.float8] table: what
// the cpu emulation and the cuda device honour, what they refuse, and notices for keys that do
// nothing (TorchTitan's Float8LinearConverter and its checks,
// torchtitan/components/quantization/float8.py). Whether the GPU has FP8 tensor cores
// (emulate = false) is known only at run time: CudaDevice::float8_matmul says it there.
void check_float8(Pass& p) {
  const Float8Config f = float8_config(p.cfg());
  const std::string t = "quantize.linear.float8.", conv = "model.converters";
  if (!f.enabled) {
    for (const char* k : {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "recipe_name",
                          "filter_fqns", "emulate"})
      if (p.is_set(t + k))
        p.add(t + k, {Outcome::kNotice,
                      "applies only to float8 training, which [model] converters = [\"float8\"] turns on"});
    return;
  }
  const std::string& device = p.cfg().training.device;
  if (device != "cpu" && device != "cuda")
    p.add(conv, {Outcome::kRefused, "\"float8\": float8 training on the " + device +
                                        " device is not implemented yet; the cuda device runs it (FP8 GEMMs, or "
                                        "emulate = true) and the cpu device emulates it"});
  else if (device == "cpu" && !f.emulate)
    p.add(p.is_set(t + "emulate") ? t + "emulate" : conv,
          {Outcome::kRefused, "the cpu device has no FP8 GEMMs, so float8 training there is only an emulation "
                              "(quantize -> dequantize, float32 GEMMs): set [quantize.linear.float8] emulate = true"});
  if (float8_converts(f, "output", 16, 16))
    p.add(p.is_set(t + "filter_fqns") ? t + "filter_fqns" : conv,
          {Outcome::kRefused, "float8 for the output head is not implemented yet (TorchTitan converts the linear "
                              "`output` unless filter_fqns names it): add \"output\" to [quantize.linear.float8] "
                              "filter_fqns, as TorchTitan's presets do"});
  // TorchTitan's flag for TorchAO's size-based filter (_auto_filter_for_recipe), not a module name.
  if (std::find(f.filter_fqns.begin(), f.filter_fqns.end(), "auto_filter_small_kn") != f.filter_fqns.end())
    p.add(t + "filter_fqns", {Outcome::kRefused, "\"auto_filter_small_kn\" (TorchAO's filter of linears too small to "
                                                 "gain from float8) is not implemented yet; name the modules to skip"});
  if (f.fsdp_float8_all_gather && f.recipe_set)
    p.add(t + "enable_fsdp_float8_all_gather",
          {Outcome::kRefused, "together with recipe_name (\"" + f.recipe +
                                  "\") is not supported, as in TorchTitan: the FP8 all-gather is the default "
                                  "(tensorwise) recipe's; leave recipe_name unset"});
  else if (f.fsdp_float8_all_gather && p.cfg().parallelism.zero_stage < 3)
    p.add(t + "enable_fsdp_float8_all_gather",
          {Outcome::kNotice, "applies to fully sharded weights, gathered per FSDP unit (zero_stage = 3, TorchTitan's "
                             "FSDP); with zero_stage = " + std::to_string(p.cfg().parallelism.zero_stage) +
                             " the weights are not gathered that way and the option has no effect"});
  if (f.precompute_scale && !f.fsdp_float8_all_gather)
    p.add(t + "precompute_float8_dynamic_scale_for_fsdp",
          {Outcome::kNotice, "applies only with enable_fsdp_float8_all_gather = true (TorchTitan ignores it)"});
}

// Async TP decomposes sequence parallelism's all-gather and reduce-scatter (TorchTitan's
// enable_async_tp applies only under tp > 1 and requires sequence parallelism too).
void check_async_tp(Pass& p) {
  const std::string key = "parallelism.enable_async_tensor_parallel";
  if (!p.is_set(key) || !p.cfg().parallelism.enable_async_tensor_parallel) return;
  if (p.cfg().parallelism.tensor_parallel_degree <= 1)
    p.add(key, {Outcome::kNotice, "true has no effect with tensor_parallel_degree = 1 (no tp collectives to overlap)"});
  else if (!p.cfg().parallelism.enable_sequence_parallel)
    p.add(key, {Outcome::kRefused, "true needs sequence parallelism (the all-gather and reduce-scatter it "
                                   "decomposes into ring steps): set [parallelism] enable_sequence_parallel = true "
                                   "or enable_async_tensor_parallel = false"});
}

}  // namespace

void apply_torchtitan_keys(JobConfig& cfg, const std::vector<std::string>& set_keys) {
  Pass p(cfg, set_keys);
  apply_dataset_path(p);
  apply_debug_seed(p);
  apply_hf_assets(p);
  for (const std::string& dotted : set_keys) {
    const Option* o = find_option(dotted);
    if (o && o->verdict) p.add(dotted, o->verdict(p.value(dotted)));
  }
  check_dataset_name(p);
  check_total_steps(p);
  check_export_dtype(p);
  check_validation_shape(p);
  check_float8(p);
  check_async_tp(p);
  p.finish();
}

}  // namespace meshtrain
