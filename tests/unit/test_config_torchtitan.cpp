// The TorchTitan compatibility layer: TOML that TorchTitan's presets write (dotted tables, inline
// comments, key=value, arrays), every key's outcome (honoured, notice, refused), the rules
// between keys, and doc/torchtitan-compat.md against the registry.
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "config/float8_config.hpp"
#include "config/option_registry.hpp"
#include "config/torchtitan_compat.hpp"
#include "config/torchtitan_keys.hpp"
#include "config_test_util.hpp"

using namespace meshtrain;
using namespace config_test;
namespace fs = std::filesystem;

namespace {

// A deck of sections the tests do not add, so that they append [model], [training],
// [parallelism], ... from line 13 on.
const char* kTt = R"([job]
description = "torchtitan test"
print_config = false
final_dump = true
[metrics]
log_freq = 1
save_tb_folder = "tb"
[lr_scheduler]
warmup_steps = 2
decay_type = "linear"
[topology]
ranks_per_node = 8
)";

// The one notice of `c` about key `label` ("[compile] enable"), or "" (and a failed check when
// there are several).
std::string notice_of(const JobConfig& c, const std::string& label) {
  std::string found;
  for (const std::string& n : c.notices)
    if (has(n, label + ": ")) {
      BOOST_TEST(found.empty(), "two notices for " << label);
      found = n;
    }
  return found;
}

// validate()'s message for `text` + `overrides` on one rank ("" when it passes).
std::string refusal_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of(text, overrides, 1);
}

}  // namespace

// ---- TOML the presets write ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dotted_tables_inline_comments_and_arrays) {
  const JobConfig c = load(std::string(kBase) +  // lines 1-12
                           "[compile]\n"                                                         // 13
                           "enable=false\n"                                                      // 14
                           "components = [\"model\", \"loss\"]  # which parts TorchTitan compiles\n"  // 15
                           "[ quantize . linear . float8 ]   # blanks around the dots\n"         // 16
                           "filter_fqns = ['output', \"router.gate\"]\n"                         // 17
                           "[quantize.grouped_mm.float8]\n"                                      // 18
                           "fqns = \"experts\"  # list[str] | str\n"                             // 19
                           "[quantize]\n"                                                        // 20
                           "linear.mx.filter_fqns = []  # a dotted key under a parent table\n"   // 21
                           "[training.dataloader]\n"                                             // 22
                           "num_workers=0\n");                                                   // 23
  BOOST_TEST(c.torchtitan.at("compile.enable") == "false");
  BOOST_TEST(c.torchtitan.at("compile.components") == "[\"model\", \"loss\"]");
  BOOST_TEST(c.torchtitan.at("quantize.linear.float8.filter_fqns") == "[\"output\", \"router.gate\"]");
  BOOST_TEST(c.torchtitan.at("quantize.grouped_mm.float8.fqns") == "[\"experts\"]");
  BOOST_TEST(c.torchtitan.at("quantize.linear.mx.filter_fqns") == "[]");
  BOOST_TEST(c.torchtitan.at("training.dataloader.num_workers") == "0");
  BOOST_TEST(has(c.origin_of("quantize.linear.float8.filter_fqns"), ".toml:17"));
  BOOST_TEST(has(c.origin_of("quantize.linear.mx.filter_fqns"), ".toml:21"));
  // enable = false and num_workers = 0 say what meshtrain does: no notice. The others tune a
  // feature meshtrain lacks: one notice each, naming the line, in deck order.
  BOOST_TEST(notice_of(c, "[compile] enable").empty());
  BOOST_TEST(notice_of(c, "[training.dataloader] num_workers").empty());
  BOOST_TEST(has(notice_of(c, "[compile] components"), ".toml:15: [compile] components: there is no torch.compile"));
  BOOST_TEST(has(notice_of(c, "[quantize.linear.float8] filter_fqns"),
                 ".toml:17: [quantize.linear.float8] filter_fqns: applies only to float8 training"));
  BOOST_TEST(has(notice_of(c, "[quantize.grouped_mm.float8] fqns"), ".toml:19:"));
  BOOST_TEST(has(notice_of(c, "[quantize.linear.mx] filter_fqns"), ".toml:21:"));
  BOOST_TEST(c.notices.size() == 4u);
  BOOST_TEST(has(c.notices.front(), ".toml:15:"));
  BOOST_TEST(has(c.notices.back(), ".toml:21:"));
  BOOST_TEST(c.validate(1).dp_shard == 1);
  // Arrays of arrays (TorchTitan's list[list[str]]).
  const JobConfig n = load(std::string(kBase) + "module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\"], [\"layers.1\"]]\n");
  BOOST_TEST(n.torchtitan.at("parallelism.module_fqns_per_model_part") ==
             "[[\"tok_embeddings\", \"layers.0\"], [\"layers.1\"]]");
  BOOST_TEST(n.notices.empty());
  BOOST_TEST_REQUIRE(n.refusals.size() == 1u);
  BOOST_TEST(has(n.refusals.front(), ".toml:13: [parallelism] module_fqns_per_model_part: explicit module lists per "
                                     "stage are not implemented yet"));
}

BOOST_AUTO_TEST_CASE(header_and_key_errors_in_dotted_tables) {
  const std::string b = kBase;
  BOOST_TEST(has(error_of(b + "[quantize.linear.float9]\n"),
                 ".toml:13: unknown section [quantize.linear.float9]; did you mean [quantize.linear.float8]?"));
  BOOST_TEST(has(error_of(b + "[quantize.linear.]\n"), ".toml:13: malformed section header"));
  BOOST_TEST(has(error_of(b + "[quantize.linear.float8]\n[quantize.linear.float8]\n"),
                 ".toml:14: section [quantize.linear.float8] appears twice"));
  // A key neither TorchTitan nor meshtrain has: the nearest key, with the dotted section.
  BOOST_TEST(has(error_of(b + "[quantize.linear.float8]\nfilter_fqn = []\n"),
                 ".toml:14: [quantize.linear.float8] filter_fqn: unknown key; did you mean 'filter_fqns'?"));
  BOOST_TEST(has(error_of(b + "[compile]\nenabel = true\n"), ".toml:14: [compile] enabel: unknown key; did you mean 'enable'?"));
  BOOST_TEST(has(error_of(b + "[quantize]\nlinear.float8.emulat = true\n"),
                 ".toml:14: [quantize.linear.float8] emulat: unknown key; did you mean 'emulate'?"));
  // Types are TorchTitan's.
  BOOST_TEST(has(error_of(b + "[compile]\ncomponents = \"model\"\n"),
                 ".toml:14: [compile] components: expected array of string, got \"model\""));
  BOOST_TEST(has(error_of(b + "[compile]\ncomponents = [\"model\", \"optimizer\"]\n"),
                 "[compile] components: value [\"model\", \"optimizer\"] is not allowed (must be one of model | loss)"));
  BOOST_TEST(has(error_of(b + "[training.dataloader]\nnum_workers = -1\n"),
                 "[training.dataloader] num_workers: value -1 is out of range (must be >= 0)"));
  BOOST_TEST(has(error_of(b, {"--parallelism.context_parallel_load_balancer="}),
                 "command line: [parallelism] context_parallel_load_balancer: value \"\" is not allowed (must be one of headtail | none)"));
  // The command line reaches dotted tables too.
  BOOST_TEST(has(error_of(b, {"--quantize.linear.float8.filter_fqn=output"}),
                 "command line: [quantize.linear.float8] filter_fqn: unknown key; did you mean '--quantize.linear.float8.filter_fqns'?"));
  BOOST_TEST(load(b, {"--quantize.linear.float8.filter_fqns=output,router.gate"}).torchtitan.at(
                 "quantize.linear.float8.filter_fqns") == "[\"output\", \"router.gate\"]");
}

// ---- outcomes ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(refused_values_say_not_implemented_yet_and_name_the_key) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[model]\nconverters = [\"quantize.linear.mx\"]", "MX (mxfp8) training is not implemented yet"},
      {"[quantize.linear.float8]\nenable = true", "[quantize.linear.float8] enable: this switch is not implemented yet"},
      {"[fault_tolerance]\nenable = true", "[fault_tolerance] enable: fault-tolerant training (torchft) is not implemented yet"},
      {"[memory_estimation]\nenable = true", "[memory_estimation] enable: memory estimation is not implemented yet"},
      {"[training]\ndtype = \"bfloat16\"", "pure bfloat16 training (no float32 master weights) is not implemented yet"},
      {"[training]\nenable_cpu_offload = true", "not implemented yet"},
      {"[profiling]\nenable_memory_snapshot = true", "CUDA memory snapshots are not implemented yet"},
      {"[optimizer]\nname = \"Adam\"", "[optimizer] name: Adam (weight decay added to the gradient) is not implemented yet"},
      {"[optimizer]\nearly_step_in_backward = true", "not implemented yet"},
      {"[activation_checkpoint]\nmode = \"memory_budget\"", "[activation_checkpoint] mode: \"memory_budget\""},
      {"[checkpoint]\ninitial_load_in_hf_quantized = true", "[checkpoint] initial_load_in_hf_quantized: loading quantized"},
      {"[checkpoint]\nexclude_from_loading = [\"optimizer\"]", "loading part of a checkpoint is not implemented yet"},
      {"[parallelism]\nexpert_parallel_comm_backend = \"deepep\"", "DeepEP dispatch is not implemented yet"},
      {"[validation]\ndataset_path = \"val.h5\"", "a separate validation token store is not implemented yet"},
      {"[comm]\nmode = \"local_tensor\"", "simulating every rank in one process is not implemented yet"},
  };
  for (const auto& [section, want] : cases) {
    const std::string deck = std::string(kTt) + section + "\n";
    const std::string e = refusal_of(deck);
    BOOST_TEST_CONTEXT(section) {
      BOOST_TEST(has(e, ".toml:14: "), e);  // the line of the key
      BOOST_TEST(has(e, want), e);
      BOOST_TEST(has(e, "not implemented yet"), e);
      BOOST_TEST(load(deck).validate_layout(1).dp_shard == 1);  // layout looks at the degrees only
    }
  }
  BOOST_TEST(has(refusal_of(kBase, {"--metrics.enable_wandb"}),
                 "command line: [metrics] enable_wandb: Weights & Biases logging is not implemented yet"));
}

// Async TP: honoured under tp > 1 with sequence parallelism; with tp 1 a notice (nothing to
// overlap), without sequence parallelism a refusal naming the key (check_async_tp).
BOOST_AUTO_TEST_CASE(async_tensor_parallel_needs_tp_and_sequence_parallelism) {
  const std::string d = std::string(kTt) + "[parallelism]\nenable_async_tensor_parallel = true\n";  // the key on line 14
  const JobConfig on = load(d, {"--parallelism.tensor_parallel_degree=2"});
  BOOST_TEST(on.refusals.empty());
  BOOST_TEST(on.notices.empty());
  BOOST_TEST(on.parallelism.enable_async_tensor_parallel);
  const JobConfig tp1 = load(d);
  BOOST_TEST(tp1.refusals.empty());
  BOOST_TEST(has(notice_of(tp1, "[parallelism] enable_async_tensor_parallel"),
                 ".toml:14: [parallelism] enable_async_tensor_parallel: true has no effect with tensor_parallel_degree = 1"));
  const std::string e =
      error_of(d, {"--parallelism.tensor_parallel_degree=2", "--parallelism.enable_sequence_parallel=false"}, 2);
  BOOST_TEST(has(e, ".toml:14: [parallelism] enable_async_tensor_parallel: true needs sequence parallelism"), e);
  BOOST_TEST(load(d + "enable_sequence_parallel = false\n").refusals.empty());  // tp 1: only the notice
}

// Float8 training: model.converters = ["float8"] with its [quantize.linear.float8] table, as the
// cpu device's emulation honours it (config/float8_config.hpp, check_float8).
BOOST_AUTO_TEST_CASE(float8_converter_and_its_table) {
  const std::string f8 = std::string(kTt) + "[model]\nconverters = [\"float8\"]\n";  // converters on line 14
  const std::string ok = f8 + "[quantize.linear.float8]\nrecipe_name = \"rowwise\"\nfilter_fqns = [\"output\"]\n"
                              "emulate = true\n";
  const JobConfig c = load(ok);
  BOOST_TEST(c.refusals.empty());
  BOOST_TEST(c.notices.empty());
  const Float8Config f = float8_config(c);
  BOOST_TEST(f.enabled);
  BOOST_TEST(f.recipe == "rowwise");
  BOOST_TEST(f.emulate);
  BOOST_TEST(f.filter_fqns == std::vector<std::string>{"output"});
  BOOST_TEST(float8_config(load(kTt)).enabled == false);
  BOOST_TEST(float8_config(load(f8)).recipe == "tensorwise");  // TorchTitan's None: TorchAO's default
  // TorchTitan's module filter: substring match, and both dims multiples of 16.
  BOOST_TEST(!float8_converts(f, "output", 2048, 256));
  BOOST_TEST(!float8_converts(f, "layers.0.attention.wq", 256, 8));
  BOOST_TEST(float8_converts(f, "layers.0.attention.wq", 256, 256));
  // The cpu device only emulates; the output head stays float32.
  BOOST_TEST(has(refusal_of(f8 + "[quantize.linear.float8]\nfilter_fqns = [\"output\"]\n"),
                 ".toml:14: [model] converters: the cpu device has no FP8 GEMMs, so float8 training there is only an "
                 "emulation"));
  BOOST_TEST(has(refusal_of(ok, {"--quantize.linear.float8.emulate=false"}),
                 "command line: [quantize.linear.float8] emulate: the cpu device has no FP8 GEMMs"));
  BOOST_TEST(has(refusal_of(ok, {"--quantize.linear.float8.filter_fqns=layers.0"}),
                 "[quantize.linear.float8] filter_fqns: float8 for the output head is not implemented yet"));
  BOOST_TEST(has(refusal_of(ok, {"--quantize.linear.float8.filter_fqns=output,auto_filter_small_kn"}),
                 "[quantize.linear.float8] filter_fqns: \"auto_filter_small_kn\" (TorchAO's filter of linears too small "
                 "to gain from float8) is not implemented yet"));
  // cuda: FP8 GEMMs (emulate = false) or the emulation, and the FP8 all-gather of FSDP shards.
  for (const char* emulate : {"true", "false"})
    BOOST_TEST(load(ok, {"--training.device=cuda", std::string("--quantize.linear.float8.emulate=") + emulate})
                   .refusals.empty());
  BOOST_TEST(load(f8 + "[quantize.linear.float8]\nfilter_fqns = [\"output\"]\nenable_fsdp_float8_all_gather = true\n",
                  {"--training.device=cuda"})
                 .refusals.empty());
  // Under tp the scaling groups a split cuts reduce their amax over tp: accepted like tp 1.
  BOOST_TEST(error_of(ok, {"--parallelism.tensor_parallel_degree=2"}, 2) == "");
  // TorchTitan's own rule: the FP8 all-gather only with the default (tensorwise) recipe.
  BOOST_TEST(has(refusal_of(ok, {"--quantize.linear.float8.enable_fsdp_float8_all_gather=true"}),
                 "[quantize.linear.float8] enable_fsdp_float8_all_gather: together with recipe_name (\"rowwise\") is not "
                 "supported"));
  const JobConfig ag = load(f8 + "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n"
                                 "precompute_float8_dynamic_scale_for_fsdp = true\nfilter_fqns = [\"output\"]\n"
                                 "emulate = true\n");
  BOOST_TEST(ag.refusals.empty());
  BOOST_TEST(ag.notices.empty());
  BOOST_TEST(has(notice_of(load(ok, {"--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp=true"}),
                           "[quantize.linear.float8] precompute_float8_dynamic_scale_for_fsdp"),
                 "applies only with enable_fsdp_float8_all_gather = true"));
  // Float8 off: the table's keys are notices.
  BOOST_TEST(has(notice_of(load(ok, {"--model.converters="}), "[quantize.linear.float8] emulate"),
                 "applies only to float8 training, which [model] converters = [\"float8\"] turns on"));
}

BOOST_AUTO_TEST_CASE(refused_values_explain_what_cannot_mean_anything_here) {
  const std::string c4 = refusal_of(std::string(kTt) + "[training]\ndataset = \"c4\"  # supported datasets: c4_test (2K), c4 (177M)\n",
                                    {"--training.steps=3"});
  BOOST_TEST(has(c4, ".toml:14: [training] dataset: \"c4\" is a Hugging Face dataset name (TorchTitan downloads it); "
                     "meshtrain trains from a pre-tokenized token store: prepare one with `meshtrain data prepare"),
             c4);
  BOOST_TEST(has(c4, "--training.dataset=FILE.h5"));
  BOOST_TEST(has(refusal_of(kBase, {"--training.dataset=c4_test"}), "command line: [training] dataset: \"c4_test\" is a "
                                                                    "Hugging Face dataset name"));
  BOOST_TEST(has(refusal_of(std::string(kBase) + "[experimental]\ncustom_import = \"my.module\"\n"),
                 ".toml:14: [experimental] custom_import: Python modules cannot be imported by meshtrain"));
  BOOST_TEST(has(refusal_of(kBase, {"--job.custom_config_module=torchtitan.models.flux.job_config"}),
                 "command line: [job] custom_config_module: a Python module extending TorchTitan's JobConfig cannot be "
                 "imported here"));
  BOOST_TEST(has(refusal_of(kBase, {"--comm.mode=fake_backend"}),
                 "[comm] mode: a dry run without GPUs is `meshtrain deck check` or `meshtrain layout`"));
  BOOST_TEST(has(refusal_of(kBase, {"--model.converters=fp4"}), "[model] converters: unknown converter \"fp4\""));
  // A file that happens to be named like a TorchTitan dataset is a token store path.
  const fs::path dir = fs::path(write_deck("")).parent_path();
  std::ofstream(dir / "c4_test") << "x";
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  BOOST_TEST(refusal_of(kBase, {"--training.dataset=c4_test"}) == "");
  fs::current_path(cwd);
}

BOOST_AUTO_TEST_CASE(models_and_flavors_torchtitan_has_are_not_implemented_yet) {
  const std::string ds = refusal_of(std::string(kBase) + "[metrics]\nlog_freq = 1\n", {"--model.name=deepseek_v3"});
  BOOST_TEST(has(ds, "command line: [model] name: Mixture-of-Experts model 'deepseek_v3' (TorchTitan) is not "
                     "implemented yet (models: llama3, qwen3, mixtral)"),
             ds);
  // Qwen3's MoE flavors are models now; expert tensor parallelism is what stays refused.
  BOOST_TEST(refusal_of("[model]\nname = \"qwen3\"\nflavor = \"debugmodel_moe\"\n") == "");
  const std::string etp = refusal_of(
      "[model]\nname = \"qwen3\"\nflavor = \"debugmodel_moe\"\n[parallelism]\nexpert_tensor_parallel_degree = 2\n");
  BOOST_TEST(has(etp, ".toml:5: [parallelism] expert_tensor_parallel_degree:"), etp);
  BOOST_TEST(has(etp, "expert tensor parallelism is not implemented yet"), etp);
  BOOST_TEST(has(refusal_of(kBase, {"--model.name=flux"}), "diffusion model 'flux' (TorchTitan) is not implemented yet"));
  // Not a TorchTitan model either: still "not allowed".
  BOOST_TEST(has(refusal_of(kBase, {"--model.name=gpt2"}), "value \"gpt2\" is not allowed (must be one of llama3 | qwen3 | mixtral)"));
}

BOOST_AUTO_TEST_CASE(notices_say_why_a_key_has_no_effect) {
  const JobConfig c = load(std::string(kBase) +
                           "[compile]\n"                                       // 13
                           "enable = true\n"                                   // 14
                           "[metrics]\n"                                       // 15
                           "disable_color_printing = false\n"                  // 16
                           "[checkpoint]\n"                                    // 17
                           "export_dtype = \"float16\"\n"                      // 18
                           "last_save_model_only = false\n"                    // 19
                           "async_mode = \"async\"  # background writes\n"     // 20
                           "[validation]\n"                                    // 21
                           "dataset = \"c4_validation\"\n"                     // 22
                           "[optimizer]\n"                                     // 23
                           "implementation = \"for-loop\"\n");                 // 24
  BOOST_TEST(notice_of(c, "[compile] enable") ==
             c.deck_path + ":14: [compile] enable: there is no torch.compile here: meshtrain's kernels are always fused");
  BOOST_TEST(notice_of(c, "[metrics] disable_color_printing") ==
             c.deck_path + ":16: [metrics] disable_color_printing: meshtrain's log lines have no colors");
  BOOST_TEST(has(notice_of(c, "[checkpoint] export_dtype"), ":18: [checkpoint] export_dtype: applies only when "
                                                            "last_save_model_only = true"));
  BOOST_TEST(notice_of(c, "[checkpoint] async_mode").empty());  // every mode is honoured
  BOOST_TEST(c.checkpoint.async_mode == "async");
  BOOST_TEST(has(notice_of(c, "[validation] dataset"), ":22: [validation] dataset: validation reads the validation split"));
  BOOST_TEST(has(notice_of(c, "[optimizer] implementation"), ":24: [optimizer] implementation: meshtrain has only its "
                                                             "multi-tensor AdamW"));
  BOOST_TEST(c.notices.size() == 5u);
  BOOST_TEST(c.refusals.empty());
  BOOST_CHECK_NO_THROW(c.validate(1));
  for (const std::string& n : c.notices) BOOST_TEST(n.find('\n') == std::string::npos);
  // The command line wins over the deck, verdict included.
  const JobConfig off = load(std::string(kBase) + "[compile]\nenable = true\n", {"--compile.enable=false"});
  BOOST_TEST(off.notices.empty());
  BOOST_TEST(refusal_of(std::string(kTt) + "[model]\nconverters = [\"float8\"]\n", {"--model.converters="}) == "");
}

// [training] dataset_path, [debug] seed and [model] tokenizer_path stand for meshtrain fields.
BOOST_AUTO_TEST_CASE(torchtitan_names_of_meshtrain_fields) {
  const std::string deck = std::string(kTt) +
                           "[training]\n"                       // 13
                           "dataset = \"c4_test\"\n"          // 14
                           "dataset_path = \"data/tiny.h5\"\n"  // 15
                           "[debug]\n"                          // 16
                           "seed = 42\n";                       // 17
  const JobConfig c = load(deck);
  BOOST_TEST(c.training.dataset == "data/tiny.h5");
  BOOST_TEST(c.training.seed == 42);
  BOOST_TEST(has(notice_of(c, "[training] dataset"),
                 ":14: [training] dataset: \"c4_test\" is only a name here: the token store is [training] dataset_path"));
  BOOST_TEST(c.validate(1).dp_shard == 1);
  // --training.dataset on the command line wins over the deck's dataset_path.
  const JobConfig o = load(deck, {"--training.dataset=other.h5"});
  BOOST_TEST(o.training.dataset == "other.h5");
  BOOST_TEST(has(notice_of(o, "[training] dataset_path"), "overridden by --training.dataset on the command line"));
  // Two seeds in the deck that disagree are refused; the command line wins over the deck.
  const std::string clash = refusal_of(std::string(kTt) + "[training]\nseed = 1\n[debug]\nseed = 2\n");
  BOOST_TEST(has(clash, ".toml:16: [debug] seed: 2 conflicts with [training] seed = 1 ("), clash);
  BOOST_TEST(load(std::string(kTt) + "[training]\nseed = 1\n[debug]\nseed = 1\n").notices.empty());
  const JobConfig cli = load(std::string(kBase) + "[debug]\nseed = 2\n", {"--training.seed=5"});
  BOOST_TEST(cli.training.seed == 5);
  BOOST_TEST(has(notice_of(cli, "[debug] seed"), "overridden by --training.seed on the command line"));
  // tokenizer_path: a tokenizer file stands for its folder.
  const fs::path dir = fs::path(write_deck("")).parent_path() / "assets";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "x";
  const JobConfig t = load(std::string(kTt) + "[model]\ntokenizer_path = \"" + (dir / "tokenizer.model").string() + "\"\n");
  BOOST_TEST(t.model.hf_assets_path == dir.string());
  BOOST_TEST(t.notices.empty());
  const JobConfig h = load(std::string(kTt) + "[model]\nhf_assets_path = \"" + dir.string() + "\"\ntokenizer_path = \"x\"\n");
  BOOST_TEST(h.model.hf_assets_path == dir.string());
  BOOST_TEST(has(notice_of(h, "[model] tokenizer_path"), "deprecated name of hf_assets_path"));
  // A preset's assets folder that is not here: training does not need it.
  const JobConfig m = load(std::string(kTt) + "[model]\nhf_assets_path = \"./assets/hf/Llama-3.1-8B\"\n");
  BOOST_TEST(has(notice_of(m, "[model] hf_assets_path"), ":14: [model] hf_assets_path: \"./assets/hf/Llama-3.1-8B\" is "
                                                         "not a folder here; training reads the pre-tokenized token store"));
}

BOOST_AUTO_TEST_CASE(rules_between_keys) {
  const std::string b = kBase;  // steps = 10, seq_len = 64, local_batch_size = 2
  BOOST_TEST(refusal_of(b + "[lr_scheduler]\ntotal_steps = 10\n") == "");
  BOOST_TEST(has(refusal_of(b + "[lr_scheduler]\ntotal_steps = 20\n"),
                 ".toml:14: [lr_scheduler] total_steps: 20 differs from [training] steps = 10: a schedule longer or "
                 "shorter than the run is not implemented yet"));
  BOOST_TEST(has(refusal_of(b + "[checkpoint]\nexport_dtype = \"bfloat16\"\nlast_save_model_only = true\n"),
                 "[checkpoint] export_dtype: bfloat16 for the HDF5 model-only last save is not implemented yet"));
  BOOST_TEST(refusal_of(b + "[checkpoint]\nenable = true\nexport_dtype = \"bfloat16\"\nlast_save_model_only = true\n"
                            "last_save_in_hf = true\n") == "");
  BOOST_TEST(refusal_of(b + "[checkpoint]\nexport_dtype = \"float32\"\nlast_save_model_only = true\n") == "");
  BOOST_TEST(refusal_of(b + "[validation]\nseq_len = 64\nlocal_batch_size = 2\n") == "");
  BOOST_TEST(has(refusal_of(b + "[validation]\nseq_len = 2048\n"),
                 "[validation] seq_len: 2048 differs from [training] seq_len = 64: validation at another shape is not "
                 "implemented yet"));
  BOOST_TEST(has(refusal_of(b, {"--validation.local_batch_size=8"}), "command line: [validation] local_batch_size: 8 "
                                                                     "differs from [training] local_batch_size = 2"));
  // The first refusal in the deck is the one reported.
  const std::string first =
      refusal_of(b + "[checkpoint]\nenable_first_step_checkpoint = true\n[fault_tolerance]\nenable = true\n");
  BOOST_TEST(has(first, ".toml:14: [checkpoint] enable_first_step_checkpoint"), first);
}

// Every TorchTitan key set to its TorchTitan default resolves (with a token store and the GPU
// device its bfloat16 default needs), and the keys that have no effect say so, one line each.
BOOST_AUTO_TEST_CASE(every_key_at_its_torchtitan_default_resolves) {
  std::string deck;
  std::string section;
  std::set<std::string> expect_notice;
  for (const std::string& name : torchtitan_key_names()) {
    const Option* o = find_option(name);
    if (o->torchtitan_default == "None" || o->torchtitan_default == "(not in v0.2.2)") continue;
    if (o->section != section) {
      section = o->section;
      deck += "[" + section + "]\n";
    }
    deck += o->key + " = " + o->torchtitan_default + "  # TorchTitan's default\n";
    if (o->verdict && o->verdict(parse_option_value(*o, o->torchtitan_default, ValueSyntax::kDeck)).outcome ==
                          Outcome::kNotice)
      expect_notice.insert(key_label(name));
  }
  // The [quantize.linear.float8] keys, set while model.converters is off, are notices (check_float8).
  for (const char* k : {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "filter_fqns",
                        "emulate"})
    expect_notice.insert("[quantize.linear.float8] " + std::string(k) + ": ");
  const JobConfig c = load(deck, {"--training.dataset_path=tiny.h5", "--training.device=cuda"});
  BOOST_TEST(c.refusals.empty(), (c.refusals.empty() ? "" : c.refusals.front()));
  BOOST_TEST(c.validate(8).dp_shard == 8);
  BOOST_TEST(c.training.mixed_precision_param == "bfloat16");
  BOOST_TEST(c.activation_checkpoint.mode == "selective");
  // Notices: the value-verdict ones, plus dataset (only a name) and hf_assets_path (no such folder).
  for (const std::string& label : expect_notice) BOOST_TEST(!notice_of(c, label.substr(0, label.size() - 2)).empty(), label);
  BOOST_TEST(c.notices.size() == expect_notice.size() + 2);
  BOOST_TEST(!notice_of(c, "[training] dataset").empty());
  BOOST_TEST(!notice_of(c, "[model] hf_assets_path").empty());
  BOOST_TEST(expect_notice.count("[compile] components: ") == 1u);
  BOOST_TEST(expect_notice.count("[checkpoint] async_mode: ") == 0u);  // honoured
}

// ---- the table -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_torchtitan_key_has_one_outcome) {
  const auto& names = torchtitan_key_names();
  std::set<std::string> sections, unique(names.begin(), names.end());
  BOOST_TEST(unique.size() == names.size());
  for (const std::string& name : names) {
    const Option* o = find_option(name);
    BOOST_TEST_REQUIRE(o != nullptr, name);
    BOOST_TEST_CONTEXT(name) {
      sections.insert(o->section.substr(0, o->section.find('.')));
      BOOST_TEST(!o->torchtitan_default.empty());
      BOOST_TEST(!o->torchtitan_outcome.empty());
      // A TorchTitan-only key's outcome is coded: a verdict, or a rule between keys (torchtitan_resolve.cpp).
      static const std::set<std::string> cross = {"model.tokenizer_path",     "lr_scheduler.total_steps",
                                                  "training.dataset_path",    "checkpoint.export_dtype",
                                                  "validation.local_batch_size", "validation.seq_len", "debug.seed",
                                                  "quantize.linear.float8.enable_fsdp_float8_all_gather",
                                                  "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
                                                  "quantize.linear.float8.recipe_name",
                                                  "quantize.linear.float8.filter_fqns",
                                                  "quantize.linear.float8.emulate"};
      if (o->torchtitan_only) BOOST_TEST((o->verdict != nullptr) != (cross.count(name) == 1));
    }
  }
  // The sections of TorchTitan v0.2.2's JobConfig, as the issue lists them.
  BOOST_TEST((sections == std::set<std::string>{"job", "profiling", "metrics", "model", "optimizer", "lr_scheduler",
                                                "training", "parallelism", "checkpoint", "activation_checkpoint",
                                                "compile", "quantize", "comm", "memory_estimation", "fault_tolerance",
                                                "experimental", "validation", "debug"}));
  // The 149 fields of the v0.2.2 dataclasses (DataLoader's under both training and validation),
  // plus [quantize.linear.float8] enable.
  BOOST_TEST(names.size() == 150u);
  for (const char* name : {"training.dataloader.prefetch_factor", "validation.dataloader.pin_memory",
                           "quantize.grouped_mm.mx.fqns", "fault_tolerance.semi_sync_method", "comm.trace_buf_size",
                           "parallelism.expert_parallel_comm_backend", "activation_checkpoint.early_stop"})
    BOOST_TEST(unique.count(name) == 1u, name);
  // meshtrain's own keys are listed separately.
  const auto own = meshtrain_only_key_names();
  const std::set<std::string> own_set(own.begin(), own.end());
  BOOST_TEST(own_set.count("training.seed") == 1u);
  BOOST_TEST(own_set.count("training.dataset") == 0u);
}

BOOST_AUTO_TEST_CASE(torchtitan_keys_are_kept_in_the_resolved_deck) {
  const JobConfig c = load(std::string(kBase) + "[compile]\nenable = true  # fused anyway\n",
                           {"--quantize.linear.float8.filter_fqns=output", "--training.dataloader.num_workers=2"});
  const std::string text = resolved_deck_toml(c);
  BOOST_TEST(has(text, "\n[compile]\nenable = true\n"));
  BOOST_TEST(has(text, "\n[quantize.linear.float8]\nfilter_fqns = [\"output\"]\n"));
  BOOST_TEST(has(text, "\n[training.dataloader]\nnum_workers = 2\n"));
  BOOST_TEST(!has(text, "[fault_tolerance]"));  // unset TorchTitan keys are not written
  const JobConfig r = load(text);
  BOOST_TEST((r.torchtitan == c.torchtitan));
  BOOST_TEST(r.notices.size() == c.notices.size());
}

BOOST_AUTO_TEST_CASE(torchtitan_compat_doc_is_current) {
  const fs::path doc = fs::path(MESHTRAIN_SOURCE_DIR) / "doc" / "torchtitan-compat.md";
  std::ifstream in(doc, std::ios::binary);
  std::ostringstream committed;
  committed << in.rdbuf();
  BOOST_TEST(committed.str() == torchtitan_compat_markdown(),
             "doc/torchtitan-compat.md is stale: regenerate it with `build/bin/meshtrain deck torchtitan --markdown > "
             "doc/torchtitan-compat.md`");
  const std::string md = torchtitan_compat_markdown(), text = torchtitan_compat_text();
  for (const std::string& name : torchtitan_key_names()) {
    const Option* o = find_option(name);
    BOOST_TEST(has(md, "| " + o->key + " | " + o->type_name() + " | "), name);
    BOOST_TEST(has(md, "\n## [" + o->section + "]\n"), name);
    BOOST_TEST(has(text, "\n[" + o->section + "]\n"), name);
  }
  // Defaults that differ are marked.
  BOOST_TEST(has(md, "| keep_latest_k | integer | 10 | **0** | honoured |"));
  BOOST_TEST(has(md, "| async_mode | string | \"disabled\" | \"disabled\" | honoured; \"async\" and "
                     "\"async_with_pinned_mem\" stage the state in host memory"));
}

BOOST_AUTO_TEST_CASE(attention_flavors_and_keys_resolve_to_document_masking) {
  // TorchTitan v0.2.2's llama3 attention flavors: the debugmodel / 8B shapes with block_causal.
  for (auto [flavor, base, type] : {std::tuple{"debugmodel_flex_attn", "debugmodel", "flex"},
                                    std::tuple{"debugmodel_varlen_attn", "debugmodel", "varlen"},
                                    std::tuple{"8B_flex", "8B", "flex"}, std::tuple{"8B_varlen", "8B", "varlen"}}) {
    const ModelArgs a = load(kBase, {std::string("--model.flavor=") + flavor}).model_args();
    const ModelArgs b = model_flavor("llama3", base);
    BOOST_TEST(a.flavor == flavor);
    BOOST_TEST(a.attn_type == type);
    BOOST_TEST(a.attn_mask_type == "block_causal");
    BOOST_TEST((a.dim == b.dim && a.n_layers == b.n_layers && a.n_kv_heads == b.n_kv_heads && a.vocab_size == b.vocab_size));
  }
  const ModelArgs plain = load(kBase).model_args();
  BOOST_TEST(plain.attn_type == "sdpa");
  BOOST_TEST(plain.attn_mask_type == "causal");
  // The keys override the flavor's choice; block_causal runs with every parallel dimension.
  BOOST_TEST(load(kBase, {"--model.flavor=debugmodel_flex_attn", "--model.attn_mask_type=causal"}).model_args().attn_mask_type ==
             "causal");
  BOOST_TEST(error_of(kBase, {"--model.attn_mask_type=block_causal", "--parallelism.context_parallel_degree=2"}, 2) == "");
  // TorchTitan's rule: varlen attention is document attention.
  BOOST_TEST(has(refusal_of(kBase, {"--model.flavor=debugmodel_varlen_attn", "--model.attn_mask_type=causal"}),
                 "[model] attn_mask_type: attn_type \"varlen\" needs attn_mask_type \"block_causal\""));
  BOOST_TEST(has(refusal_of(kBase, {"--model.attn_type=varlen"}), "[model] attn_type: attn_type \"varlen\" needs"));
  // The CUDA kernels mask documents too (attention_fwd.cu / attention_bwd.cu).
  BOOST_TEST(!has(refusal_of(kBase, {"--model.flavor=8B_flex", "--training.device=cuda"}), "block_causal"));
  BOOST_TEST(has(refusal_of(kBase, {"--model.attn_mask_type=sliding"}), "value \"sliding\" is not allowed"));
}

