// The TorchTitan table: every key of TorchTitan v0.2.2's JobConfig (torchtitan/config/
// job_config.py) in its order, with its TorchTitan default and what meshtrain does with each
// value. Keys meshtrain has under the same name are "shared" (the meshtrain option is the field;
// this adds the TorchTitan default, the outcome text and, where a value is refused, its verdict);
// the others are TorchTitan-only options whose value is kept in JobConfig::torchtitan.
//
// How an outcome is chosen (doc/torchtitan-compat.md says the same to users):
//  - a value that states what meshtrain does anyway is honoured (expert_parallel_comm_backend = "standard");
//  - a switch that asks for a feature meshtrain lacks is refused when on, "not implemented yet"
//    (enable_cpu_offload = true), and honoured when off;
//  - a key that only tunes a feature meshtrain lacks or has no use for (the float8 recipe, the
//    context-parallel load balancer, torch.compile's backend, the Python GC) gets a notice
//    whatever its value: TorchTitan itself ignores such keys while their feature is off;
//  - a value that cannot mean anything here is refused with the reason (a Python module to import).
#include <algorithm>
#include <utility>

#include "config/torchtitan_keys.hpp"

namespace meshtrain {

namespace {

using VerdictFn = std::function<Verdict(const OptionValue&)>;

Verdict honoured_v() { return {}; }
Verdict notice_v(const std::string& why) { return {Outcome::kNotice, why}; }
Verdict refused_v(const std::string& why) { return {Outcome::kRefused, why}; }

// An outcome: the compat table's text and the verdict that implements it (nullptr: honoured).
struct Rule {
  std::string text;
  VerdictFn verdict;
};

Rule honoured(const std::string& note = "") { return {note.empty() ? "honoured" : "honoured; " + note, nullptr}; }

Rule notice(const std::string& why) {
  return {"notice: " + why, [why](const OptionValue&) { return notice_v(why); }};
}

Rule refused_when_set(const std::string& why) {
  return {"refused when set: " + why, [why](const OptionValue&) { return refused_v(why); }};
}

Rule refused_if_true(const std::string& why) {
  return {"false: honoured; true: refused (" + why + ")",
          [why](const OptionValue& v) { return v.b ? refused_v(why) : honoured_v(); }};
}

Rule notice_if_true(const std::string& why) {
  return {"false: honoured; true: notice (" + why + ")",
          [why](const OptionValue& v) { return v.b ? notice_v(why) : honoured_v(); }};
}

Rule notice_if_false(const std::string& why) {
  return {"true: honoured; false: notice (" + why + ")",
          [why](const OptionValue& v) { return v.b ? honoured_v() : notice_v(why); }};
}

Rule refused_unless(const std::string& ok, const std::string& why) {
  return {"\"" + ok + "\": honoured; other values: refused (" + why + ")",
          [ok, why](const OptionValue& v) { return v.text == ok ? honoured_v() : refused_v(why); }};
}

Rule refused_unless_empty_string(const std::string& why) {
  return {"\"\": honoured; other values: refused (" + why + ")",
          [why](const OptionValue& v) { return v.text.empty() ? honoured_v() : refused_v(why); }};
}

Rule refused_unless_empty_list(const std::string& why) {
  return {"[]: honoured; other values: refused (" + why + ")",
          [why](const OptionValue& v) { return v.items.empty() ? honoured_v() : refused_v(why); }};
}

// The rows in TorchTitan's order; `in` selects the section of the rows that follow.
class Table {
 public:
  std::vector<Option> rows;

  void in(const char* section) { section_ = section; }

  /// A key meshtrain has under the same name.
  void shared(const char* key, const char* tt_default, const Rule& r = honoured()) {
    Option o;
    o.section = section_;
    o.key = key;
    o.torchtitan_default = tt_default;
    o.torchtitan_outcome = r.text;
    o.verdict = r.verdict;
    rows.push_back(std::move(o));
  }

  Option& str(const char* key, const char* tt_default, const Rule& r, const std::vector<std::string>& choices = {}) {
    Option& o = only(key, OptionType::kString, tt_default, r);
    o.choices = choices;
    o.allowed = choices.empty() ? "any" : "";
    for (size_t i = 0; i < choices.size(); ++i) o.allowed += (i ? " | " : "") + choices[i];
    return o;
  }
  Option& integer(const char* key, const char* tt_default, const Rule& r, double min) {
    Option& o = only(key, OptionType::kInt, tt_default, r);
    o.min = min;
    o.allowed = ">= " + std::to_string(int64_t(min));
    return o;
  }
  Option& real(const char* key, const char* tt_default, const Rule& r, double min, double max) {
    Option& o = only(key, OptionType::kFloat, tt_default, r);
    o.min = min;
    o.max = max;
    o.allowed = "in [" + std::to_string(int64_t(min)) + ", " + std::to_string(int64_t(max)) + "]";
    return o;
  }
  Option& boolean(const char* key, const char* tt_default, const Rule& r) {
    Option& o = only(key, OptionType::kBool, tt_default, r);
    o.allowed = "true | false";
    return o;
  }
  /// An array of strings.
  Option& list(const char* key, const char* tt_default, const Rule& r, const std::vector<std::string>& choices = {}) {
    Option& o = str(key, tt_default, r, choices);
    o.array = true;
    return o;
  }

 private:
  std::string section_;

  Option& only(const char* key, OptionType type, const char* tt_default, const Rule& r) {
    Option o;
    o.section = section_;
    o.key = key;
    o.type = type;
    o.torchtitan_only = true;
    o.torchtitan_default = tt_default;
    o.default_text = std::string(tt_default) == "None" ? "(unset)" : tt_default;
    o.torchtitan_outcome = r.text;
    o.verdict = r.verdict;
    o.doc = "TorchTitan key; " + r.text;
    rows.push_back(std::move(o));
    return rows.back();
  }
};

const std::string kMx = "applies only to MX (mxfp8) training (model.converters), which is not implemented yet";
const std::string kGroupedMm =
    "applies only to low-precision (float8 / MX) grouped GEMMs of Mixture-of-Experts models, which are not "
    "implemented yet; meshtrain's grouped GEMMs run in the compute dtype";
const std::string kNoCompile = "there is no torch.compile here: meshtrain's kernels are always fused";
const std::string kNoGc = "meshtrain has no Python garbage collector; memory is freed when tensors go out of scope";
const std::string kNoWorkers = "meshtrain's loader reads the token store in the training process (no worker processes)";
const std::string kFlightRecorder =
    "meshtrain has no NCCL flight recorder; a collective that misses its deadline is printed with its group";
const std::string kFt = "applies only with fault_tolerance.enable (torchft), which is not implemented yet";

// model.converters: TorchTitan's converter names (torchtitan/components/quantization/*.py) plus
// the legacy "float8" its presets still write.
Rule converters_rule() {
  return {"[]: honoured; \"float8\" / \"quantize.linear.float8\": honoured on the cuda device (cuBLASLt FP8 "
          "GEMMs; with [quantize.linear.float8] emulate = true the emulation) and on the cpu device as an emulation "
          "with emulate = true (refused without it), under tensor parallelism too; MX / grouped-GEMM converters: "
          "refused (not implemented yet); other names: refused (unknown converter)",
          [](const OptionValue& v) {
            for (const OptionValue& c : v.items) {
              const std::string& n = c.text;
              if (n == "float8" || n == "quantize.linear.float8") continue;  // checked with its table (check_float8)
              if (n == "mx" || n == "quantize.linear.mx")
                return refused_v("\"" + n + "\": MX (mxfp8) training is not implemented yet");
              if (n == "quantize.grouped_mm.float8" || n == "quantize.grouped_mm.mx")
                return refused_v("\"" + n + "\": quantized grouped GEMMs of Mixture-of-Experts layers are not "
                                 "implemented yet");
              return refused_v("unknown converter \"" + n + "\" (TorchTitan's: quantize.linear.float8, "
                               "quantize.linear.mx, quantize.grouped_mm.float8, quantize.grouped_mm.mx)");
            }
            return honoured_v();
          }};
}

// [training.dataloader] and [validation.dataloader]: TorchTitan's DataLoader dataclass.
void dataloader(Table& t, const char* section) {
  t.in(section);
  t.integer("num_workers", "0",
            {"0: honoured; more: notice (" + kNoWorkers + ")",
             [](const OptionValue& v) { return v.i == 0 ? honoured_v() : notice_v(kNoWorkers); }},
            0);
  t.boolean("persistent_workers", "false", notice_if_true(kNoWorkers));
  t.boolean("pin_memory", "false",
            notice_if_true("batches reach the device through meshtrain's device backend, not a PyTorch DataLoader"));
  t.integer("prefetch_factor", "None", notice(kNoWorkers), 1);
}

Table build_table() {
  Table t;
  t.in("job");
  t.str("config_file", "None", notice("a deck cannot name another deck: the deck is the file given to --deck"));
  t.shared("dump_folder", "\"./outputs\"");
  t.shared("description", "\"default job\"");
  t.shared("print_config", "false", honoured("true: rank 0 prints the resolved deck at start (train, deck check)"));
  t.str("save_config_file", "None",
        notice("meshtrain writes the resolved deck to <dump_folder>/deck.resolved.toml on every run; no second copy "
               "is made"));
  t.str("custom_config_module", "\"\"",
        refused_unless_empty_string("a Python module extending TorchTitan's JobConfig cannot be imported here; "
                                    "its keys would be unknown"));

  t.in("profiling");
  t.shared("enable_profiling", "false");
  t.shared("save_traces_folder", "\"profile_traces\"");
  t.shared("profile_freq", "10");
  t.shared("profiler_active", "1");
  t.shared("profiler_warmup", "3");
  t.boolean("enable_memory_snapshot", "false", refused_if_true("CUDA memory snapshots are not implemented yet"));
  t.str("save_memory_snapshot_folder", "\"memory_snapshot\"",
        notice("no memory snapshots are written (enable_memory_snapshot = true is not implemented yet)"));

  t.in("metrics");
  t.shared("log_freq", "10");
  t.shared("enable_tensorboard", "false");
  t.boolean("disable_color_printing", "false", notice_if_false("meshtrain's log lines have no colors"));
  t.shared("save_tb_folder", "\"tb\"");
  t.shared("save_for_all_ranks", "false");
  t.boolean("enable_wandb", "false",
            refused_if_true("Weights & Biases logging is not implemented yet; metrics go to metrics.jsonl and, with "
                            "enable_tensorboard, TensorBoard event files"));

  t.in("model");
  t.shared("name", "\"llama3\"",
           honoured("meshtrain adds mixtral; deepseek_v3, llama4, gpt_oss (Mixture-of-Experts), flux, llama3_ft: "
                    "refused, not implemented yet"));
  t.shared("flavor", "\"debugmodel\"",
           honoured("qwen3 debugmodel_moe / 30B-A3B / 235B-A22B are the Mixture-of-Experts flavors; llama3 "
                    "debugmodel_flex_attn / debugmodel_varlen_attn / 8B_flex / 8B_varlen: honoured as debugmodel / 8B "
                    "with [model] attn_type flex / varlen and attn_mask_type = \"block_causal\" (document "
                    "masking)"));
  t.shared("hf_assets_path", "\"./tests/assets/tokenizer\"",
           honoured("`meshtrain data prepare --hf-assets-path` reads its tokenizer.model and `ckpt export` copies its "
                    "tokenizer files next to model.safetensors; a folder that does not exist here: notice (training "
                    "reads the pre-tokenized token store)"));
  t.str("tokenizer_path", "None",
        {"honoured as hf_assets_path (a file: its folder) when hf_assets_path is not set; with hf_assets_path set: "
         "notice (TorchTitan's deprecated name; hf_assets_path is used)",
         nullptr});
  t.list("converters", "[]", converters_rule());
  t.boolean("print_after_conversion", "false",
            notice_if_true("the model is not printed: the training log lists the linears float8 converts, and "
                           "`meshtrain model info` prints the model's shapes"));

  t.in("optimizer");
  t.shared("name", "\"AdamW\"",
           {"\"AdamW\", \"Muon\": honoured (Muon: meshtrain's distributed Muon with an AdamW group); \"Adam\": "
            "refused (not implemented yet)",
            [](const OptionValue& v) {
              return v.text == "Adam" ? refused_v("Adam (weight decay added to the gradient) is not implemented yet; "
                                                  "AdamW and Muon are")
                                      : honoured_v();
            }});
  t.shared("lr", "0.0008");
  t.shared("beta1", "0.9");
  t.shared("beta2", "0.95");
  t.shared("eps", "1e-08");
  t.shared("weight_decay", "0.1");
  t.str("implementation", "\"fused\"",
        {"\"fused\", \"foreach\": honoured (one multi-tensor AdamW kernel per step); \"for-loop\": notice",
         [](const OptionValue& v) {
           return v.text == "for-loop" ? notice_v("meshtrain has only its multi-tensor AdamW, which computes the same "
                                                  "update as a for-loop one")
                                       : honoured_v();
         }},
        {"for-loop", "foreach", "fused"});
  t.boolean("early_step_in_backward", "false",
            refused_if_true("the optimizer step inside backward is not implemented yet"));

  t.in("lr_scheduler");
  t.shared("warmup_steps", "200");
  t.integer("total_steps", "None",
            {"equal to [training] steps: honoured; other values: refused (a schedule longer or shorter than the run "
             "is not implemented yet)",
             nullptr},
            1);
  t.shared("decay_ratio", "None");
  t.shared("decay_type", "\"linear\"");
  t.shared("min_lr_factor", "0.0");

  t.in("training");
  t.shared("dataset", "\"c4_test\"",
           honoured("the token-store path; a TorchTitan dataset name (c4, c4_test, ...) that is no file here: refused, "
                    "saying how to prepare a token store; with dataset_path set: notice (only a name)"));
  t.str("dataset_path", "None",
        {"honoured: the token-store path (dataset is then only a name); a --training.dataset override wins", nullptr});
  t.shared("local_batch_size", "8");
  t.shared("global_batch_size", "-1");
  t.shared("seq_len", "2048");
  t.shared("max_norm", "1.0");
  t.shared("steps", "10000");
  t.boolean("enable_cpu_offload", "false",
            refused_if_true("CPU offloading of parameters, gradients and optimizer state is not implemented yet"));
  t.str("dtype", "\"float32\"",
        refused_unless("float32", "pure bfloat16 training (no float32 master weights) is not implemented yet; "
                                  "mixed_precision_param = \"bfloat16\" is"),
        {"bfloat16", "float32"});
  t.shared("mixed_precision_param", "\"bfloat16\"",
           honoured("an unset key means float32 here: bfloat16 needs device = \"cuda\""));
  t.shared("mixed_precision_reduce", "\"float32\"");
  t.integer("gc_freq", "50", notice(kNoGc), 1);
  t.boolean("gc_debug", "false", notice_if_true(kNoGc));

  dataloader(t, "training.dataloader");

  t.in("parallelism");
  t.shared("data_parallel_replicate_degree", "1");
  t.shared("data_parallel_shard_degree", "-1");
  t.shared("fsdp_reshard_after_forward", "\"default\"");
  t.shared("tensor_parallel_degree", "1");
  t.shared("disable_loss_parallel", "false");
  // tp == 1 and sequence parallelism off: check_async_tp (torchtitan_resolve.cpp).
  t.shared("enable_async_tensor_parallel", "false",
           honoured("true needs sequence parallelism (refused without it) and has no effect with tp 1 (notice)"));
  t.shared("pipeline_parallel_degree", "1", honoured("pipeline stages (schedules GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, or a CSV)"));
  Option& parts = t.list("module_fqns_per_model_part", "None",
                         refused_when_set("explicit module lists per stage are not implemented yet (the blocks are "
                                          "split by pipeline_parallel_layers_per_stage and the _less_layers weights)"));
  parts.nested = true;
  t.shared("pipeline_parallel_first_stage_less_layers", "1");
  t.shared("pipeline_parallel_last_stage_less_layers", "1");
  t.shared("pipeline_parallel_layers_per_stage", "None");
  t.shared("pipeline_parallel_schedule", "\"1F1B\"",
           honoured("PyTorch's other schedule classes (LoopedBFS, DualPipeV, PipelineScheduleSingle / Multi) are not "
                    "allowed"));
  t.shared("pipeline_parallel_schedule_csv", "\"\"",
           honoured("pipeline_parallel_schedule still sets the stages per rank and their placement, as in TorchTitan"));
  t.shared("pipeline_parallel_microbatch_size", "1");
  t.boolean("pipeline_parallel_expert_parallel_overlap", "true",
            notice_if_true("meshtrain does not overlap the experts' all-to-all of one micro-batch with another's "
                           "compute (DualPipeV style); the key has no effect"));
  t.shared("context_parallel_degree", "1", honoured("ring attention over the cp group; parameters sharded over "
                                                    "dp_shard × cp"));
  t.shared("context_parallel_load_balancer", "\"headtail\"",
           honoured("\"none\" stands for TorchTitan's None; \"ptrr\" (FlexAttention's) is not offered"));
  t.shared("context_parallel_rotate_method", "\"allgather\"", honoured("meshtrain adds \"ulysses\""));
  t.shared("expert_parallel_degree", "1",
           honoured("ep ranks borrowed from dp_shard × cp as in TorchTitan; with bfloat16 mixed precision > 1 is "
                    "refused (not implemented yet)"));
  t.integer("expert_tensor_parallel_degree", "1",
            refused_unless("1", "expert tensor parallelism is not implemented yet: under tp meshtrain keeps each "
                                "expert whole on every tp rank"),
            1);
  t.str("expert_parallel_comm_backend", "\"standard\"",
        refused_unless("standard", "DeepEP dispatch is not implemented yet (meshtrain has the standard all-to-all)"),
        {"standard", "deepep"});

  t.in("checkpoint");
  t.shared("enable", "false");
  t.boolean("enable_ft_dataloader_checkpoints", "true",
            notice_if_false("meshtrain's checkpoints always hold the loader position (and there is no torchft)"));
  t.shared("folder", "\"checkpoint\"");
  t.shared("interval", "500");
  t.shared("initial_load_path", "None");
  t.shared("initial_load_model_only", "true");
  t.shared("initial_load_in_hf", "false");
  t.boolean("initial_load_in_hf_quantized", "false",
            refused_if_true("loading quantized Hugging Face safetensors is not implemented yet"));
  t.shared("last_save_model_only", "true");
  t.shared("last_save_in_hf", "false");
  t.shared("export_dtype", "\"float32\"");
  t.shared("async_mode", "\"disabled\"",
           honoured("\"async\" and \"async_with_pinned_mem\" stage the state in host memory (ordinary, not pinned: "
                    "meshtrain has no pinned-host allocator yet) and write it from a background thread, which needs "
                    "MPI_THREAD_MULTIPLE"));
  t.shared("keep_latest_k", "10");
  t.shared("load_step", "-1");
  t.list("exclude_from_loading", "[]",
         refused_unless_empty_list("loading part of a checkpoint is not implemented yet"));
  t.boolean("enable_first_step_checkpoint", "false",
            refused_if_true("a checkpoint after the first step is not implemented yet (interval = 1 saves every "
                            "step)"));
  t.boolean("create_seed_checkpoint", "false",
            refused_if_true("seed checkpoints are not implemented yet (initialization is a pure function of "
                            "[training] seed)"));
  t.boolean("load_only", "false", refused_if_true("loading checkpoints without saving any is not implemented yet"));

  t.in("activation_checkpoint");
  t.shared("mode", "\"selective\"",
           {"none / selective / full: honoured (meshtrain's default is none); \"memory_budget\": refused (not "
            "implemented yet)",
            [](const OptionValue& v) {
              return v.text == "memory_budget"
                         ? refused_v("\"memory_budget\" (recomputation chosen by torch.compile's partitioner) is "
                                     "not implemented yet")
                         : honoured_v();
            }});
  t.shared("selective_ac_option", "\"2\"",
           honoured("\"op\": per-operator checkpointing with TorchTitan's policy (attention, reduce-scatter / "
                    "all-to-all and every second matmul kept)"));
  t.list("per_op_sac_force_recompute_mm_shapes_by_fqns", "[\"moe.router.gate\"]",
         {"[\"moe.router.gate\"]: honoured (the MoE router's gate matmul is recomputed, outside the matmul count); "
          "other values: refused (not implemented yet)",
          [](const OptionValue& v) {
            return v.items.size() == 1 && v.items[0].text == "moe.router.gate"
                       ? honoured_v()
                       : refused_v("only [\"moe.router.gate\"] is implemented (other force-recompute lists are not "
                                   "implemented yet)");
          }});
  t.boolean("early_stop", "false",
            notice_if_true("meshtrain recomputes a whole block's forward; torch.utils.checkpoint's early stop does "
                           "not apply"));
  t.real("memory_budget", "0.5", notice("applies only to mode = \"memory_budget\", which is not implemented yet"), 0,
         1);
  t.boolean("visualize_memory_budget_pareto", "false",
            notice_if_true("applies only to mode = \"memory_budget\", which is not implemented yet"));
  t.boolean("preserve_rng_state", "true",
            notice_if_false("the blocks draw no random numbers (no dropout): recomputation is exact either way"));
  t.str("determinism_check", "\"default\"",
        notice("torch.utils.checkpoint's check of recomputed tensors does not apply; meshtrain's recomputation is "
               "deterministic"));
  t.boolean("debug", "false", notice_if_true("torch.utils.checkpoint's debug output does not exist here"));

  t.in("compile");
  t.boolean("enable", "false", notice_if_true(kNoCompile));
  t.list("components", "[\"model\", \"loss\"]", notice(kNoCompile), {"model", "loss"});
  t.str("backend", "\"inductor\"", notice(kNoCompile));

  t.in("quantize.linear.float8");
  // Not a v0.2.2 key (v0.2.2 switches float8 on through model.converters); decks written for
  // other TorchTitan versions say it, and the answer they need is "not implemented yet".
  t.boolean("enable", "(not in v0.2.2)",
            refused_if_true("this switch is not implemented yet: TorchTitan v0.2.2 turns float8 training on with "
                            "[model] converters = [\"float8\"]"));
  // The other keys apply only while model.converters names float8; check_float8
  // (torchtitan_resolve.cpp) gives their notices and refusals, which depend on other keys.
  t.boolean("enable_fsdp_float8_all_gather", "false",
            {"with float8 on, no recipe_name (tensorwise): honoured on the cuda and cpu devices (FSDP all-gathers "
             "the Float8 linears' weights as e4m3 codes, 1 byte per element instead of 2 (bf16) or 4: each shard "
             "cast with the whole weight's amax, one amax all-reduce per unit; the GEMMs' casts give back the same "
             "codes, so the losses equal a high-precision gather's); true with recipe_name: refused (TorchTitan "
             "rejects the pair); float8 off: notice",
             nullptr});
  t.boolean("precompute_float8_dynamic_scale_for_fsdp", "false",
            {"with enable_fsdp_float8_all_gather: honoured (the FP8 all-gather always batches its amax: one "
             "all-reduce per FSDP unit, with the scales TorchAO's one all-reduce after the optimizer step gives); "
             "without it: notice (TorchTitan ignores it); float8 off: notice",
             nullptr});
  t.str("recipe_name", "None",
        {"with float8 on: honoured (TorchAO's recipe; unset is TorchAO's default, tensorwise); float8 off: notice",
         nullptr},
        {"tensorwise", "rowwise", "rowwise_with_gw_hp"});
  t.list("filter_fqns", "[]",
         {"with float8 on: honoured (a linear whose module name contains an entry stays float32, as TorchTitan's "
          "module_filter_fn); an output head left in float8 and \"auto_filter_small_kn\" are refused (not implemented "
          "yet: add \"output\", as TorchTitan's presets do); float8 off: notice",
          nullptr});
  t.boolean("emulate", "false",
            {"with float8 on, device cuda: false honoured (FP8 GEMMs, compute capability >= 8.9), true honoured "
             "(the emulation: quantize -> dequantize, high-precision GEMMs); device cpu: true honoured (the "
             "emulation, float32 GEMMs: the cpu device's only mode), false refused; float8 off: notice",
             nullptr});

  t.in("quantize.linear.mx");
  t.str("mxfp8_dim1_cast_kernel_choice", "\"triton\"", notice(kMx), {"triton", "cuda", "torch"});
  t.str("recipe_name", "\"mxfp8_cublas\"", notice(kMx));
  t.list("filter_fqns", "[\"output\"]", notice(kMx));

  t.in("quantize.grouped_mm.float8");
  t.list("fqns", "[]", notice(kGroupedMm)).scalar_too = true;

  t.in("quantize.grouped_mm.mx");
  t.str("recipe_name", "\"mxfp8\"", notice(kGroupedMm), {"mxfp8"});
  t.list("fqns", "[]", notice(kGroupedMm)).scalar_too = true;

  t.in("comm");
  t.shared("init_timeout_seconds", "300");
  t.shared("train_timeout_seconds", "100");
  t.integer("trace_buf_size", "20000",
            {"0: honoured; more: notice (" + kFlightRecorder + ")",
             [](const OptionValue& v) { return v.i == 0 ? honoured_v() : notice_v(kFlightRecorder); }},
            0);
  t.str("save_traces_folder", "\"comm_traces\"", notice(kFlightRecorder));
  t.str("save_traces_file_prefix", "\"rank_\"", notice(kFlightRecorder));
  t.str("mode", "\"default\"",
        {"\"default\": honoured; \"fake_backend\": refused (a dry run is `meshtrain deck check` or `meshtrain "
         "layout`); \"local_tensor\": refused (not implemented yet)",
         [](const OptionValue& v) {
           if (v.text == "fake_backend")
             return refused_v("a dry run without GPUs is `meshtrain deck check` or `meshtrain layout`, which need "
                              "no launch");
           if (v.text == "local_tensor")
             return refused_v("simulating every rank in one process is not implemented yet");
           return honoured_v();
         }},
        {"default", "fake_backend", "local_tensor"});

  t.in("memory_estimation");
  t.boolean("enable", "false",
            refused_if_true("memory estimation is not implemented yet (`meshtrain deck check` and `meshtrain "
                            "layout` report the model size and layout)"));
  t.boolean("disable_fake_mode", "false",
            notice("applies only with memory_estimation.enable, which is not implemented yet"));

  t.in("fault_tolerance");
  t.boolean("enable", "false",
            refused_if_true("fault-tolerant training (torchft) is not implemented yet; meshtrain restarts from its "
                            "latest checkpoint"));
  t.str("process_group", "\"gloo\"", notice(kFt));
  t.integer("process_group_timeout_ms", "10000", notice(kFt), 1);
  t.integer("replica_id", "0", notice(kFt), 0);
  t.integer("group_size", "0", notice(kFt), 0);
  t.integer("min_replica_size", "1", notice(kFt), 1);
  t.str("semi_sync_method", "None", notice(kFt));

  t.in("experimental");
  t.str("custom_import", "\"\"", refused_unless_empty_string("Python modules cannot be imported by meshtrain"));
  t.str("custom_args_module", "\"\"",
        refused_unless_empty_string("Python modules cannot be imported by meshtrain"));

  t.in("validation");
  t.shared("enable", "false");
  t.str("dataset", "\"c4_validation\"",
        notice("validation reads the validation split of the [training] token store (written by `meshtrain data "
               "prepare --validation-fraction`)"));
  t.str("dataset_path", "None",
        refused_when_set("a separate validation token store is not implemented yet (validation reads the "
                         "validation split of [training] dataset)"));
  t.integer("local_batch_size", "8",
            {"equal to [training] local_batch_size: honoured; other values: refused (not implemented yet)",
             nullptr},
            1);
  t.integer("seq_len", "2048",
            {"equal to [training] seq_len: honoured; other values: refused (not implemented yet)", nullptr}, 1);
  t.shared("freq", "10");
  t.shared("steps", "-1");
  dataloader(t, "validation.dataloader");

  t.in("debug");
  t.integer("seed", "None",
            {"honoured as [training] seed (both set to different values: refused; the command line wins over the "
             "deck)",
             nullptr},
            0);
  t.boolean("deterministic", "false",
            notice_if_false("meshtrain's kernels are always deterministic (fixed reduction order)"));
  t.boolean("deterministic_warn_only", "false",
            notice_if_true("every meshtrain kernel is deterministic; there is nothing to warn about"));
  t.shared("moe_force_load_balance", "false",
           honoured("round-robin by sequence position, (t·top_k + j) % num_experts, so every layout routes alike "
                    "(TorchTitan counts the rank's local tokens)"));
  return t;
}

const std::vector<Option>& table() {
  static const std::vector<Option> rows = build_table().rows;
  return rows;
}

// Where a section TorchTitan has and meshtrain does not goes in the registry: after this one.
std::string section_after(const std::string& section) {
  static const std::vector<std::pair<std::string, std::string>> after = {
      {"training.dataloader", "training"},
      {"compile", "activation_checkpoint"},
      {"quantize.linear.float8", "compile"},
      {"quantize.linear.mx", "quantize.linear.float8"},
      {"quantize.grouped_mm.float8", "quantize.linear.mx"},
      {"quantize.grouped_mm.mx", "quantize.grouped_mm.float8"},
      {"memory_estimation", "comm"},
      {"fault_tolerance", "memory_estimation"},
      {"experimental", "fault_tolerance"},
      {"validation.dataloader", "validation"}};
  for (const auto& [s, a] : after)
    if (s == section) return a;
  return "";
}

// A TorchTitan-only option keeps its value, as TOML, in JobConfig::torchtitan.
void bind_to_torchtitan_map(Option& o) {
  Option shape = o;
  const std::string name = o.dotted();
  o.set = [shape, name](JobConfig& c, const OptionValue& v) { c.torchtitan[name] = option_value_toml(shape, v); };
  o.get = [name](const JobConfig& c) {
    const auto it = c.torchtitan.find(name);
    return it == c.torchtitan.end() ? std::string() : it->second;
  };
}

}  // namespace

void add_torchtitan_keys(std::vector<Option>& options) {
  for (const Option& row : table()) {
    if (!row.torchtitan_only) {
      for (Option& o : options)
        if (o.dotted() == row.dotted()) {
          o.torchtitan_default = row.torchtitan_default;
          o.torchtitan_outcome = row.torchtitan_outcome;
          o.verdict = row.verdict;
        }
      continue;  // a shared name missing from the registry fails the registry test
    }
    Option o = row;
    bind_to_torchtitan_map(o);
    // After the section's last option, or after the last option of the section it follows.
    for (std::string s = o.section; !s.empty(); s = section_after(s)) {
      const auto last = std::find_if(options.rbegin(), options.rend(), [&](const Option& x) { return x.section == s; });
      if (last != options.rend()) {
        options.insert(last.base(), std::move(o));
        break;
      }
    }
  }
}

const std::vector<std::string>& torchtitan_key_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Option& row : table()) n.push_back(row.dotted());
    return n;
  }();
  return names;
}

std::vector<std::string> meshtrain_only_key_names() {
  std::vector<std::string> n;
  for (const Option& o : option_registry())
    if (o.torchtitan_default.empty()) n.push_back(o.dotted());
  return n;
}

bool is_torchtitan_dataset_name(const std::string& name) {
  // torchtitan/hf_datasets/text_datasets.py, models/flux/flux_datasets.py, experiments/vlm.
  static const std::vector<std::string> names = {"c4",        "c4_test",    "c4_validation",   "cc12m",
                                                 "cc12m-test", "cc12m-wds", "coco-validation", "obelics"};
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace meshtrain
