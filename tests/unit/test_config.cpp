#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/deck_parser.hpp"
#include "util/errors.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

const char* kBase = R"([job]
description = "test"   # trailing comment
[model]
name = "llama3"
flavor = "debugmodel"
[training]
local_batch_size = 2
seq_len = 64
steps = 10
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
)";

std::string write_deck(const std::string& text) {
  static int n = 0;
  const fs::path p = fs::temp_directory_path() / ("meshtrain_test_deck_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".toml");
  std::ofstream(p) << text;
  return p.string();
}

// The ConfigError message of loading `deck` (with overrides) and validating for `world` ranks.
std::string error_of(const std::string& deck_text, std::vector<std::string> overrides = {}, int64_t world = 1) {
  const std::string path = write_deck(deck_text);
  try {
    load_job_config(path, overrides).validate(world);
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find('\n') == std::string::npos);  // one line
    return msg;
  }
  return "";
}

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(base_deck_loads_and_validates) {
  const JobConfig c = load_job_config(write_deck(kBase), {});
  BOOST_TEST(c.training.seq_len == 64);
  BOOST_TEST(c.job.description == "test");
  const ParallelDims d = c.validate(1);
  BOOST_TEST(d.dp_shard == 1);  // -1 fills the world (on more ranks: FSDP, rejected below)
}

BOOST_AUTO_TEST_CASE(unknown_key_names_nearest_with_line) {
  const std::string e = error_of(std::string(kBase) + "[optimizer]\nlrr = 0.1\n");
  BOOST_TEST(has(e, ":14: [optimizer] lrr: unknown key; did you mean 'optimizer.lr'?"), e);
}

BOOST_AUTO_TEST_CASE(unknown_section_and_key_outside_section) {
  BOOST_TEST(has(error_of("[trainig]\nsteps = 1\n"), ":1: unknown section [trainig]"));
  BOOST_TEST(has(error_of("steps = 1\n"), ":1: key 'steps' outside any [section]"));
}

BOOST_AUTO_TEST_CASE(wrong_types) {
  BOOST_TEST(has(error_of(std::string(kBase) + "[metrics]\nlog_freq = \"ten\"\n"), "[metrics] log_freq: expected integer"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[optimizer]\nlr = abc\n"), "[optimizer] lr: expected float"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[validation]\nenable = yes\n"), "[validation] enable: expected boolean"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[lr_scheduler]\ndecay_type = cosine\n"), "expected a quoted string"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[metrics]\nlog_freq = [1, 2]\n"), "arrays are not allowed"));
}

BOOST_AUTO_TEST_CASE(values_out_of_range) {
  BOOST_TEST(has(error_of(std::string(kBase) + "[optimizer]\nlr = -1.0\n"), "[optimizer] lr: value -1.0 is out of range (must be > 0"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[lr_scheduler]\ndecay_type = \"exp\"\n"), "must be one of linear | sqrt | cosine"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[lr_scheduler]\ndecay_ratio = 1.5\n"), "[lr_scheduler] decay_ratio: value 1.5 is out of range"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[optimizer]\nbeta1 = 1.0\n"), "[optimizer] beta1"));
  BOOST_TEST(has(error_of(std::string(kBase), {"--training.steps=0"}), "command line: [training] steps: value 0 is out of range"));
  BOOST_TEST(has(error_of(std::string(kBase), {"--model.name=gpt2"}), "must be one of llama3 | qwen3"));
  BOOST_TEST(has(error_of(std::string(kBase), {"--parallelism.data_parallel_shard_degree=-2"}), "out of range"));
}

BOOST_AUTO_TEST_CASE(duplicate_and_malformed_lines) {
  BOOST_TEST(has(error_of(std::string(kBase) + "[metrics]\nlog_freq = 1\nlog_freq = 2\n"), "duplicate key (first set on line 14)"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[metrics]\nlog_freq 1\n"), ":14: malformed line"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[metrics\n"), ":13: malformed section header"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[job]\n"), "section [job] appears twice"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[metrics]\nlog_freq =\n"), "missing value"));
  BOOST_TEST(has(error_of("[job]\ndescription = \"open\n"), "unterminated string"));
}

BOOST_AUTO_TEST_CASE(missing_deck_file) {
  BOOST_CHECK_EXCEPTION(load_job_config("/nonexistent/deck.toml", {}), ConfigError, [](const ConfigError& e) {
    return has(e.what(), "/nonexistent/deck.toml: cannot read deck (No such file or directory)");
  });
}

BOOST_AUTO_TEST_CASE(command_line_wins_and_unknown_override_fails) {
  const JobConfig c = load_job_config(write_deck(kBase), {"--training.seq_len=128", "--optimizer.lr", "0.5"});
  BOOST_TEST(c.training.seq_len == 128);
  BOOST_TEST(c.optimizer.lr == 0.5);
  BOOST_TEST(c.origin_of("training.seq_len") == "command line");
  BOOST_TEST(has(c.origin_of("training.steps"), ":9"));
  BOOST_TEST(has(error_of(kBase, {"--training.seqlen=5"}), "did you mean '--training.seq_len'"));
  BOOST_TEST(has(error_of(kBase, {"stray"}), "unexpected argument 'stray'"));
}

BOOST_AUTO_TEST_CASE(parallel_arithmetic) {
  BOOST_TEST(has(error_of(kBase, {"--parallelism.data_parallel_replicate_degree=3"}, 4),
                 "-1 cannot fill world size 4"));
  BOOST_TEST(has(error_of(kBase, {"--parallelism.data_parallel_replicate_degree=2", "--parallelism.data_parallel_shard_degree=1"}, 4),
                 "but the world size is 4"));
  const JobConfig c = load_job_config(write_deck(kBase), {"--parallelism.data_parallel_replicate_degree=4"});
  const ParallelDims d = c.validate(4);
  BOOST_TEST(d.dp_shard == 1);
  BOOST_TEST(c.global_batch(d) == 8);
  BOOST_TEST(c.grad_accum_steps(d) == 1);
}

BOOST_AUTO_TEST_CASE(model_and_batch_rules) {
  BOOST_TEST(has(error_of(kBase, {"--model.n_kv_heads=5"}), "n_heads 16 is not divisible by n_kv_heads 5"));
  BOOST_TEST(has(error_of(kBase, {"--parallelism.tensor_parallel_degree=3", "--parallelism.data_parallel_shard_degree=1"}, 3),
                 "n_heads 16 is not divisible by tp 3"));
  BOOST_TEST(has(error_of(kBase, {"--model.n_kv_heads=2", "--parallelism.tensor_parallel_degree=4", "--parallelism.data_parallel_shard_degree=1"}, 4),
                 "n_kv_heads 2 is not divisible by tp 4"));
  BOOST_TEST(has(error_of(kBase, {"--parallelism.context_parallel_degree=3", "--training.seq_len=64", "--parallelism.data_parallel_shard_degree=1"}, 3),
                 "not divisible by 2·cp = 6"));
  BOOST_TEST(has(error_of(kBase, {"--training.global_batch_size=6", "--parallelism.data_parallel_replicate_degree=2"}, 2),
                 "6 is not divisible by local_batch_size × dp = 2 × 2"));
  BOOST_TEST(has(error_of(kBase, {"--parallelism.expert_parallel_degree=2", "--parallelism.data_parallel_replicate_degree=2"}, 2),
                 "num_experts % ep"));
  BOOST_TEST(has(error_of(kBase, {"--model.flavor=13B"}), "[model] flavor: unknown flavor '13B'"));
  BOOST_TEST(has(error_of(kBase, {"--model.dim=100"}), "dim 100 is not divisible by n_heads 16"));
  const JobConfig c = load_job_config(write_deck(kBase), {"--training.global_batch_size=8"});
  BOOST_TEST(c.grad_accum_steps(c.validate(1)) == 4);
}

BOOST_AUTO_TEST_CASE(not_implemented_yet_rules) {
  const std::vector<std::pair<std::vector<std::string>, int64_t>> cases = {
      {{}, 2},  // dp_shard fills to 2: FSDP
      {{"--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1"}, 2},
      {{"--parallelism.pipeline_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1"}, 2},
      {{"--parallelism.context_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1"}, 2},
      {{"--checkpoint.enable=true"}, 1},
      {{"--training.mixed_precision_param=bfloat16"}, 1},
      {{"--training.mixed_precision_reduce=bfloat16"}, 1},
      {{"--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op"}, 1},
  };
  for (const auto& [ov, world] : cases) {
    const std::string e = error_of(kBase, ov, world);
    BOOST_TEST(has(e, "not implemented yet"), e);
  }
  BOOST_TEST(has(error_of(kBase, {"--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=x"}),
                 "must be a positive integer"));
}

BOOST_AUTO_TEST_CASE(resolved_deck_round_trips) {
  const JobConfig c = load_job_config(write_deck(kBase), {"--model.n_layers=3", "--lr_scheduler.decay_ratio=0.5"});
  const std::string text = resolved_deck_toml(c);
  const JobConfig r = load_job_config(write_deck(text), {});
  BOOST_TEST(resolved_deck_toml(r).substr(text.find('\n')) == text.substr(text.find('\n')));
  BOOST_TEST(*r.model.n_layers == 3);
  BOOST_TEST(*r.lr_scheduler.decay_ratio == 0.5);
  BOOST_TEST(!r.model.dim.has_value());
}

BOOST_AUTO_TEST_CASE(published_flavors) {
  auto params = [](const char* n, const char* f) { return double(model_flavor(n, f).num_params()); };
  BOOST_TEST(model_flavor("llama3", "8B").ffn_dim() == 14336);
  BOOST_TEST(model_flavor("llama3", "70B").ffn_dim() == 28672);
  BOOST_TEST(model_flavor("llama3", "405B").ffn_dim() == 53248);
  BOOST_TEST(model_flavor("llama3", "1B").ffn_dim() == 8192);
  BOOST_TEST(std::fabs(params("llama3", "8B") / 8.030e9 - 1) < 1e-3);
  BOOST_TEST(std::fabs(params("llama3", "70B") / 70.554e9 - 1) < 1e-3);
  BOOST_TEST(std::fabs(params("llama3", "405B") / 405.85e9 - 1) < 1e-3);
  BOOST_TEST(std::fabs(params("llama3", "1B") / 1.236e9 - 1) < 1e-3);
  BOOST_TEST(std::fabs(params("qwen3", "32B") / 32.76e9 - 1) < 2e-3);
  BOOST_TEST(std::fabs(params("qwen3", "0.6B") / 0.596e9 - 1) < 2e-3);
  BOOST_CHECK_THROW(model_flavor("llama3", "7B"), std::out_of_range);
}
