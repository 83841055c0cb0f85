// Deck and command-line parsing, every error rule of load_job_config() and validate(), the
// resolved deck round trip and the repository's decks. Registry, TOML values, the reference and
// the flavors are in test_config_registry.cpp.
#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <utility>

#include "config_test_util.hpp"

using namespace meshtrain;
using namespace config_test;
namespace fs = std::filesystem;

// ---- loading -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(base_deck_loads_with_origins_and_defaults) {
  const JobConfig c = load(kBase);
  BOOST_TEST(c.training.seq_len == 64);
  BOOST_TEST(c.job.description == "test");
  BOOST_TEST(c.optimizer.lr == 8e-4);  // not in the deck: JobConfig's default
  BOOST_TEST(has(c.origin_of("training.seq_len"), ".toml:8"));
  BOOST_TEST(c.origin_of("optimizer.lr") == c.deck_path);  // unset keys point at the deck
  const ParallelDims d = c.validate(1);
  BOOST_TEST(d.dp_shard == 1);
  BOOST_TEST(c.dump_folder() == (fs::path("checkpoint") / fs::path(c.deck_path).stem()).string());
}

BOOST_AUTO_TEST_CASE(toml_syntax_strings_comments_numbers) {
  const JobConfig c = load(
      "\xEF\xBB\xBF# byte-order mark and a CRLF line below\r\n"
      "[job]\r\n"
      "description = \"run #3 \\\"quoted\\\" \\u00e9\"  # a comment after a string with #\n"
      "dump_folder = 'C:\\out\\#1'\n"
      "  [ training ]  # blanks around a header\n"
      "steps = 1_000\n"
      "seed = +7\n"
      "[optimizer]\n"
      "lr = 3E-4\n"
      "weight_decay = 0\n"  // an integer is a fine float
      "[validation]\n"
      "enable = true\n");
  BOOST_TEST(c.job.description == "run #3 \"quoted\" \xC3\xA9");
  BOOST_TEST(c.job.dump_folder == "C:\\out\\#1");
  BOOST_TEST(c.training.steps == 1000);
  BOOST_TEST(c.training.seed == 7);
  BOOST_TEST(c.optimizer.lr == 3e-4);
  BOOST_TEST(c.optimizer.weight_decay == 0.0);
  BOOST_TEST(c.validation.enable);
}

BOOST_AUTO_TEST_CASE(unknown_key_names_the_nearest_key_and_line) {
  BOOST_TEST(error_of(std::string(kBase) + "[optimizer]\nlrr = 0.1\n").ends_with(
                 ".toml:14: [optimizer] lrr: unknown key; did you mean 'lr'?"));
  BOOST_TEST(has(error_of(std::string(kBase) + "[metrics]\nlog_frequency = 5\n"),
                 ":14: [metrics] log_frequency: unknown key; did you mean 'log_freq'?"));
  // A real key in the wrong section: name the section it belongs to.
  BOOST_TEST(has(error_of(std::string(kBase) + "[optimizer]\nsteps = 5\n"),
                 ":14: [optimizer] steps: unknown key; did you mean 'steps' in [training]?"));
}

BOOST_AUTO_TEST_CASE(unknown_section_and_key_outside_any_section) {
  const std::string e = error_of("[trainig]\nsteps = 1\n");
  BOOST_TEST(has(e, ".toml:1: unknown section [trainig]; did you mean [training]? (sections: job, model,"), e);
  BOOST_TEST(has(error_of("steps = 1\n"), ".toml:1: key 'steps' outside any [section]; did you mean [training] steps?"));
  BOOST_TEST(has(error_of("# comment\n\nlr = 1\n"), ".toml:3: key 'lr' outside any [section]; did you mean [optimizer] lr?"));
  BOOST_TEST(has(error_of("foo = 1\n"), ".toml:1: key 'foo' outside any [section] (a deck starts with a [section] header)"));
  BOOST_TEST(has(error_of("[ckpt]\n"), "unknown section [ckpt]; did you mean [checkpoint]?"));
}

BOOST_AUTO_TEST_CASE(wrong_types) {
  const std::string b = kBase;
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq = \"ten\"\n"), ":14: [metrics] log_freq: expected integer, got \"ten\""));
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq = abc\n"), "[metrics] log_freq: expected integer, got abc"));
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq = 1.5\n"), "expected integer, got 1.5"));
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq = 99999999999999999999\n"), "expected integer"));
  BOOST_TEST(has(error_of(b + "[optimizer]\nlr = abc\n"), "[optimizer] lr: expected float, got abc"));
  BOOST_TEST(has(error_of(b + "[optimizer]\nlr = nan\n"), "[optimizer] lr: expected float, got nan (a finite number"));
  BOOST_TEST(has(error_of(b + "[optimizer]\nlr = inf\n"), "expected float, got inf"));
  BOOST_TEST(has(error_of(b + "[optimizer]\nlr = 1e999\n"), "expected float, got 1e999"));
  BOOST_TEST(has(error_of(b + "[validation]\nenable = yes\n"), "[validation] enable: expected boolean true or false, got yes"));
  BOOST_TEST(has(error_of(b + "[validation]\nenable = True\n"), "expected boolean"));
  BOOST_TEST(has(error_of(b + "[lr_scheduler]\ndecay_type = cosine\n"),
                 "[lr_scheduler] decay_type: expected a quoted string, got cosine"));
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq = [1, 2]\n"), "expected integer, got [1, 2] (arrays are not allowed here)"));
  BOOST_TEST(has(error_of(b, {"--training.steps=abc"}), "command line: [training] steps: expected integer, got abc"));
  BOOST_TEST(has(error_of(b, {"--training.steps="}), "command line: [training] steps: expected integer, got nothing"));
}

// One key per rule of the registry; each message states the rule.
BOOST_AUTO_TEST_CASE(values_out_of_range) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--optimizer.lr=0", "[optimizer] lr: value 0 is out of range (must be > 0)"},
      {"--optimizer.lr=-1.0", "value -1.0 is out of range (must be > 0)"},
      {"--optimizer.beta1=1.0", "[optimizer] beta1: value 1.0 is out of range (must be in [0, 1))"},
      {"--optimizer.beta2=-0.1", "[optimizer] beta2: value -0.1 is out of range (must be in [0, 1))"},
      {"--optimizer.eps=0", "[optimizer] eps: value 0 is out of range (must be > 0)"},
      {"--optimizer.weight_decay=-0.01", "[optimizer] weight_decay: value -0.01 is out of range (must be >= 0)"},
      {"--optimizer.name=SGD", "[optimizer] name: value \"SGD\" is not allowed (must be one of AdamW | Muon | Adam)"},
      {"--lr_scheduler.warmup_steps=-1", "[lr_scheduler] warmup_steps: value -1 is out of range (must be >= 0)"},
      {"--lr_scheduler.decay_ratio=1.5", "[lr_scheduler] decay_ratio: value 1.5 is out of range (must be in [0, 1])"},
      {"--lr_scheduler.decay_type=exp", "[lr_scheduler] decay_type: value \"exp\" is not allowed (must be one of linear | sqrt | cosine)"},
      {"--lr_scheduler.min_lr_factor=2", "[lr_scheduler] min_lr_factor: value 2 is out of range (must be in [0, 1])"},
      {"--training.local_batch_size=0", "[training] local_batch_size: value 0 is out of range (must be >= 1)"},
      {"--training.global_batch_size=0", "[training] global_batch_size: value 0 is out of range (must be >= 1 or -1)"},
      {"--training.global_batch_size=-2", "must be >= 1 or -1"},
      {"--training.seq_len=0", "[training] seq_len: value 0 is out of range (must be >= 1)"},
      {"--training.steps=0", "command line: [training] steps: value 0 is out of range (must be >= 1)"},
      {"--training.seed=-1", "[training] seed: value -1 is out of range (must be >= 0)"},
      {"--training.mixed_precision_param=float16", "must be one of float32 | bfloat16"},
      {"--training.mixed_precision_reduce=fp8", "[training] mixed_precision_reduce: value \"fp8\" is not allowed"},
      {"--parallelism.data_parallel_replicate_degree=0", "[parallelism] data_parallel_replicate_degree: value 0 is out of range (must be >= 1)"},
      {"--parallelism.data_parallel_shard_degree=-2", "[parallelism] data_parallel_shard_degree: value -2 is out of range (must be >= 1 or -1)"},
      {"--parallelism.data_parallel_shard_degree=0", "must be >= 1 or -1"},
      {"--parallelism.tensor_parallel_degree=0", "[parallelism] tensor_parallel_degree: value 0 is out of range (must be >= 1)"},
      {"--parallelism.pipeline_parallel_degree=-1", "[parallelism] pipeline_parallel_degree: value -1 is out of range"},
      {"--parallelism.context_parallel_degree=0", "[parallelism] context_parallel_degree: value 0 is out of range"},
      {"--parallelism.expert_parallel_degree=0", "[parallelism] expert_parallel_degree: value 0 is out of range"},
      {"--activation_checkpoint.mode=partial", "[activation_checkpoint] mode: value \"partial\" is not allowed (must be one of none | selective | full | memory_budget)"},
      {"--activation_checkpoint.selective_ac_option=0", "[activation_checkpoint] selective_ac_option: value \"0\" is not allowed (must be a positive integer N or \"op\")"},
      {"--metrics.log_freq=0", "[metrics] log_freq: value 0 is out of range (must be >= 1)"},
      {"--validation.freq=0", "[validation] freq: value 0 is out of range (must be >= 1)"},
      {"--validation.steps=0", "[validation] steps: value 0 is out of range (must be >= 1 or -1)"},
      {"--validation.steps=-5", "must be >= 1 or -1"},
      {"--model.name=gpt2", "[model] name: value \"gpt2\" is not allowed (must be one of llama3 | qwen3 | mixtral)"},
      {"--model.dim=0", "[model] dim: value 0 is out of range (must be >= 1)"},
      {"--model.norm_eps=0", "[model] norm_eps: value 0 is out of range (must be > 0)"},
      {"--checkpoint.keep_latest_k=-1", "[checkpoint] keep_latest_k: value -1 is out of range (must be >= 0)"},
      {"--comm.train_timeout_seconds=0", "[comm] train_timeout_seconds: value 0 is out of range (must be > 0)"},
      {"--topology.ranks_per_node=0", "[topology] ranks_per_node: value 0 is out of range (must be >= 1)"},
  };
  for (const auto& [override, want] : cases) {
    const std::string e = error_of(kBase, {override});
    BOOST_TEST(has(e, want), override << " -> " << e);
  }
  // In a deck the message names the line.
  BOOST_TEST(has(error_of(std::string(kBase) + "[optimizer]\n\nlr = -1.0\n"),
                 ".toml:15: [optimizer] lr: value -1.0 is out of range (must be > 0)"));
  // Boundaries inside the ranges load.
  BOOST_TEST(error_of(kBase, {"--optimizer.beta1=0", "--lr_scheduler.decay_ratio=1", "--lr_scheduler.min_lr_factor=1",
                              "--training.global_batch_size=-1", "--validation.steps=-1", "--lr_scheduler.warmup_steps=0",
                              "--training.seed=0", "--training.max_norm=-1"}) == "");
}

BOOST_AUTO_TEST_CASE(duplicate_and_malformed_lines) {
  const std::string b = kBase;
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq = 1\nlog_freq = 2\n"),
                 ".toml:15: [metrics] log_freq: duplicate key (first set on line 14)"));
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq 1\n"), ".toml:14: malformed line 'log_freq 1' (expected key = value)"));
  BOOST_TEST(has(error_of(b + "[metrics]\nlog freq = 1\n"), ".toml:14: malformed line 'log freq = 1' (a key is letters"));
  BOOST_TEST(has(error_of(b + "[metrics\n"), ".toml:13: malformed section header '[metrics' (expected [section] or [section.table])"));
  BOOST_TEST(has(error_of(b + "[[metrics]]\n"), ".toml:13: malformed section header"));
  BOOST_TEST(has(error_of(b + "[job]\n"), ".toml:13: section [job] appears twice"));
  BOOST_TEST(has(error_of(b + "[metrics]\nlog_freq =\n"), ".toml:14: [metrics] log_freq: missing value"));
  BOOST_TEST(has(error_of("[job]\ndescription = \"open\n"), ".toml:2: [job] description: unterminated string \"open"));
  BOOST_TEST(has(error_of("[job]\ndescription = \"a\" \"b\"\n"), "[job] description: unexpected text ' \"b\"' after the closing quote"));
  BOOST_TEST(has(error_of("[job]\ndescription = \"C:\\dir\"\n"), "[job] description: unknown escape \\d"));
}

BOOST_AUTO_TEST_CASE(missing_or_unreadable_deck) {
  auto message = [](const std::string& path) {
    try {
      load_job_config(path, {});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  BOOST_TEST(message("/nonexistent/deck.toml") == "/nonexistent/deck.toml: cannot read deck (No such file or directory)");
  const std::string dir = fs::path(write_deck("")).parent_path().string();
  BOOST_TEST(message(dir) == dir + ": cannot read deck (Is a directory)");
  BOOST_TEST(has(message(""), "no deck given"));
  const JobConfig empty = load("");  // an empty deck is all defaults
  BOOST_TEST(empty.training.steps == JobConfig{}.training.steps);
}

// ---- command line --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(command_line_wins_over_the_deck) {
  const JobConfig c = load(kBase, {"--training.seq_len=128", "--optimizer.lr", "0.5", "--parallelism.data_parallel_shard_degree", "-1",
                                   "--job.description=smoke test #1", "--job.dump_folder=\"quoted\"", "--validation.enable"});
  BOOST_TEST(c.training.seq_len == 128);
  BOOST_TEST(c.optimizer.lr == 0.5);
  BOOST_TEST(c.parallelism.data_parallel_shard_degree == -1);
  BOOST_TEST(c.job.description == "smoke test #1");  // strings need no quotes on the command line
  BOOST_TEST(c.job.dump_folder == "quoted");          // but may have them
  BOOST_TEST(c.validation.enable);                    // a bare boolean flag is true
  BOOST_TEST(c.origin_of("training.seq_len") == "command line");
  BOOST_TEST(has(c.origin_of("training.steps"), ".toml:9"));
  // The last of repeated overrides wins (make run ARGS=... after the Makefile's own).
  BOOST_TEST(load(kBase, {"--training.steps=3", "--training.steps=4"}).training.steps == 4);
  BOOST_TEST(!load(kBase, {"--validation.enable", "false"}).validation.enable);
}

BOOST_AUTO_TEST_CASE(command_line_errors) {
  BOOST_TEST(has(error_of(kBase, {"--training.seqlen=5"}), "command line: [training] seqlen: unknown key; did you mean '--training.seq_len'?"));
  BOOST_TEST(has(error_of(kBase, {"--training.lr=5"}), "command line: [training] lr: unknown key; did you mean '--optimizer.lr'?"));
  BOOST_TEST(has(error_of(kBase, {"--steps=5"}), "command line: --steps: unknown key; did you mean '--training.steps'?"));
  BOOST_TEST(has(error_of(kBase, {"stray"}), "command line: unexpected argument 'stray'"));
  BOOST_TEST(has(error_of(kBase, {"--training.steps"}), "command line: [training] steps: missing value (--training.steps=value)"));
  BOOST_TEST(has(error_of(kBase, {"--model.name=gpt2"}), "command line: [model] name:"));
}

// ---- validate(): arithmetic and model compatibility ------------------------------------------

BOOST_AUTO_TEST_CASE(dp_shard_minus_one_fills_the_world) {
  const JobConfig c = load(kBase, {"--parallelism.data_parallel_replicate_degree=2", "--parallelism.tensor_parallel_degree=2"});
  const ParallelDims d = c.validate_layout(16);
  BOOST_TEST(d.dp_shard == 4);
  BOOST_TEST(d.dp() == 8);
  BOOST_TEST(d.world() == 16);
  const JobConfig r = load(kBase, {"--parallelism.data_parallel_replicate_degree=4"});
  const ParallelDims dr = r.validate(4);  // pure replication: dp_shard -1 -> 1, runs
  BOOST_TEST(dr.dp_shard == 1);
  BOOST_TEST(r.global_batch(dr) == 8);
  BOOST_TEST(r.grad_accum_steps(dr) == 1);
}

BOOST_AUTO_TEST_CASE(world_size_product) {
  // dp_shard = -1 is on deck line 12: that line is named.
  BOOST_TEST(has(error_of(kBase, {"--parallelism.data_parallel_replicate_degree=3"}, 4),
                 ".toml:12: [parallelism] data_parallel_shard_degree: -1 cannot fill world size 4: it is not divisible by "
                 "dp_replicate 3 × cp 1 × tp 1 × pp 1 = 3 (dp_replicate × dp_shard × cp × tp × pp == world size)"));
  BOOST_TEST(has(error_of(kBase, {"--parallelism.data_parallel_replicate_degree=2", "--parallelism.data_parallel_shard_degree=1"}, 4),
                 "command line: [parallelism] data_parallel_shard_degree: dp_replicate 2 × cp 1 × tp 1 × pp 1 × dp_shard 1 = 2 "
                 "but the world size is 4"));
}

BOOST_AUTO_TEST_CASE(model_and_batch_rules_name_the_responsible_key) {
  const std::string b = kBase;
  const std::vector<std::string> shard1 = {"--parallelism.data_parallel_shard_degree=1"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), shard1.begin(), shard1.end());
    return v;
  };
  BOOST_TEST(has(error_of(b, {"--model.n_kv_heads=5"}),
                 "command line: [model] n_kv_heads: n_heads 16 is not divisible by n_kv_heads 5 (grouped-query attention"));
  BOOST_TEST(has(error_of(b, with({"--parallelism.tensor_parallel_degree=3"}), 3),
                 "[parallelism] tensor_parallel_degree: n_heads 16 is not divisible by tp 3 (n_heads % tp == 0)"));
  BOOST_TEST(has(error_of(b, with({"--model.n_kv_heads=2", "--parallelism.tensor_parallel_degree=4"}), 4),
                 "[parallelism] tensor_parallel_degree: n_kv_heads 2 is not divisible by tp 4 (n_kv_heads % tp == 0)"));
  BOOST_TEST(has(error_of(b, with({"--parallelism.context_parallel_degree=3"}), 3),
                 ".toml:8: [training] seq_len: seq_len 64 is not divisible by 2·cp = 6 (zigzag"));
  BOOST_TEST(has(error_of(b, with({"--parallelism.tensor_parallel_degree=2", "--training.seq_len=33"}), 2),
                 "[training] seq_len: seq_len / cp = 33 is not divisible by tp 2 (sequence parallelism"));
  // Context parallelism: each cp chunk's tokens split over tp (seq_len % (2·cp·tp)); Ulysses
  // splits every tp rank's heads over cp.
  BOOST_TEST(has(error_of(b, with({"--parallelism.context_parallel_degree=2", "--parallelism.tensor_parallel_degree=2",
                                   "--training.seq_len=36"}), 4),
                 "[training] seq_len: seq_len 36 is not divisible by 2·cp·tp = 8"));
  BOOST_TEST(error_of(b, with({"--parallelism.context_parallel_degree=2", "--parallelism.tensor_parallel_degree=2"}),
                      4) == "");
  BOOST_TEST(has(error_of(b, with({"--parallelism.context_parallel_degree=4", "--model.n_kv_heads=2",
                                   "--parallelism.context_parallel_rotate_method=ulysses"}), 4),
                 "[parallelism] context_parallel_rotate_method: \"ulysses\" gives each cp rank a share of every tp "
                 "rank's heads, but n_kv_heads 2 is not divisible by cp × tp = 4"));
  BOOST_TEST(error_of(b, with({"--parallelism.context_parallel_degree=4", "--model.n_kv_heads=4",
                               "--parallelism.context_parallel_rotate_method=ulysses"}), 4) == "");
  BOOST_TEST(has(error_of(b, with({"--parallelism.context_parallel_degree=2",
                                   "--parallelism.context_parallel_load_balancer=ptrr"}), 2),
                 "[parallelism] context_parallel_load_balancer: value \"ptrr\" is not allowed"));
  // Without sequence parallelism the residual stream is replicated: any seq_len works.
  BOOST_TEST(error_of(b, with({"--parallelism.tensor_parallel_degree=2", "--training.seq_len=33",
                               "--parallelism.enable_sequence_parallel=false"}), 2) == "");
  // Vocabulary rows and FFN units split ⌈E/tp⌉ per rank: 5 rows over tp 4 leave rank 3 none.
  BOOST_TEST(has(error_of(b, with({"--parallelism.tensor_parallel_degree=4", "--model.vocab_size=5"}), 4),
                 "[model] vocab_size: vocab_size 5 leaves tp rank 3 of 4 nothing to hold"));
  BOOST_TEST(error_of(b, with({"--parallelism.tensor_parallel_degree=4", "--model.vocab_size=515"}), 4) == "");
  // Pipeline stages follow TorchTitan's split (more in test_config_pipeline.cpp): 6 blocks, the
  // embedding and the head fill at most 8 stages.
  BOOST_TEST(has(error_of(b, with({"--parallelism.pipeline_parallel_degree=9"}), 9),
                 "[parallelism] pipeline_parallel_degree: 9 stages for 8 effective layers"));
  BOOST_TEST(has(error_of(b, {"--parallelism.expert_parallel_degree=2", "--parallelism.data_parallel_replicate_degree=2"}, 2),
                 "[parallelism] expert_parallel_degree: expert parallelism needs a Mixture-of-Experts model ([model] "
                 "num_experts > 0, num_experts % ep == 0)"));
  BOOST_TEST(has(error_of(b, {"--training.global_batch_size=6", "--parallelism.data_parallel_replicate_degree=2"}, 2),
                 "[training] global_batch_size: 6 is not divisible by local_batch_size × dp = 2 × 2 (global_batch_size % "
                 "(local_batch_size × dp) == 0"));
  BOOST_TEST(has(error_of(b, {"--model.flavor=13B"}),
                 "command line: [model] flavor: unknown flavor '13B' of model 'llama3' (flavors: debugmodel, 1B, 3B, 8B, 70B, 405B)"));
  BOOST_TEST(has(error_of(b, {"--model.dim=100"}), "[model] dim: dim 100 is not divisible by n_heads 16 (head_dim = dim / n_heads"));
  BOOST_TEST(has(error_of(b, {"--model.dim=48", "--model.n_heads=16", "--model.n_kv_heads=16"}), "head_dim 3 is odd"));
  BOOST_TEST(has(error_of(b, {"--model.head_dim=7"}), "[model] head_dim: head_dim 7 is odd"));
  BOOST_TEST(has(error_of(b, {"--model.use_rope_scaling=true", "--model.rope_high_freq_factor=0.5"}),
                 "[model] rope_high_freq_factor: rope_high_freq_factor 0.5 must exceed rope_low_freq_factor 1.0"));
  // A deck key is named by its line.
  BOOST_TEST(has(error_of(std::string(kBase).replace(std::string(kBase).find("seq_len = 64"), 12, "seq_len = 66"),
                          with({"--parallelism.context_parallel_degree=2"}), 2),
                 ".toml:8: [training] seq_len: seq_len 66 is not divisible by 2·cp = 4"));
  // Gradient accumulation: global 8 = local 2 × dp 1 × 4.
  const JobConfig c = load(b, {"--training.global_batch_size=8"});
  BOOST_TEST(c.grad_accum_steps(c.validate(1)) == 4);
  BOOST_TEST(c.global_batch(c.validate(1)) == 8);
}

BOOST_AUTO_TEST_CASE(model_name_and_world_size_errors_from_code) {
  JobConfig c;  // built in code: no deck, no origins
  c.model.name = "gpt2";
  BOOST_CHECK_EXCEPTION(c.model_args(), ConfigError, [](const ConfigError& e) {
    return std::string(e.what()) == "deck: [model] name: unknown model 'gpt2' (models: llama3, qwen3, mixtral)";
  });
  BOOST_CHECK_THROW(JobConfig{}.validate(0), ConfigError);
  JobConfig s;
  s.activation_checkpoint.selective_ac_option = "x";
  BOOST_CHECK_EXCEPTION(s.validate(1), ConfigError, [](const ConfigError& e) {
    return has(e.what(), "[activation_checkpoint] selective_ac_option: 'x' must be a positive integer N");
  });
}

// ---- validate(): sharded data parallelism (ZeRO stages) ---------------------------------------

BOOST_AUTO_TEST_CASE(sharding_rules_name_their_key) {
  BOOST_TEST(error_of(kBase, {}, 2).empty());  // dp_shard = -1 fills 2 ranks: FSDP 2
  BOOST_TEST(error_of(kBase, {"--parallelism.zero_stage=1"}, 4).empty());
  // cp > 1 shards over dp_shard × cp even with dp_shard 1: FSDP, and ZeRO-1/2 are allowed.
  BOOST_TEST(error_of(kBase, {"--parallelism.zero_stage=2", "--parallelism.context_parallel_degree=2",
                              "--parallelism.data_parallel_shard_degree=1"}, 2).empty());
  const std::vector<std::tuple<std::vector<std::string>, int64_t, std::string>> cases = {
      {{"--parallelism.zero_stage=1", "--parallelism.data_parallel_replicate_degree=2"}, 2,
       "[parallelism] zero_stage: ZeRO-1 shards over the fsdp group (dp_shard × cp), but data_parallel_shard_degree "
       "and context_parallel_degree are 1"},
      {{"--parallelism.zero_stage=2"}, 1, "[parallelism] zero_stage: ZeRO-2 shards over the fsdp group"},
      {{"--parallelism.zero_stage=4"}, 2, "[parallelism] zero_stage: value 4 is out of range"},
      {{"--parallelism.zero_stage=2", "--parallelism.fsdp_reshard_after_forward=never"}, 2,
       "[parallelism] fsdp_reshard_after_forward: \"never\" applies to sharded parameters (zero_stage 3)"},
      {{"--parallelism.fsdp_reshard_after_forward=false"}, 2,
       "[parallelism] fsdp_reshard_after_forward: value \"false\" is not allowed"},
  };
  for (const auto& [ov, world, want] : cases) {
    const std::string e = error_of(kBase, ov, world);
    BOOST_TEST_INFO(e);
    BOOST_TEST(has(e, want));
  }
}

// ---- validate(): options that parse but are not implemented yet ------------------------------

BOOST_AUTO_TEST_CASE(not_implemented_yet_rules_name_their_key) {
  const std::vector<std::tuple<std::vector<std::string>, int64_t, std::string>> cases = {
      {{"--activation_checkpoint.mode=memory_budget"}, 1, "[activation_checkpoint] mode: \"memory_budget\""},
  };
  for (const auto& [ov, world, want] : cases) {
    const std::string e = error_of(kBase, ov, world);
    BOOST_TEST(has(e, "not implemented yet"), e);
    BOOST_TEST(has(e, want), e);
  }
  // bfloat16 compute is the CUDA backend's; the cpu device is the float32 reference.
  const std::string bf = error_of(kBase, {"--training.mixed_precision_param=bfloat16"}, 1);
  BOOST_TEST(has(bf, "[training] mixed_precision_param: bfloat16 needs [training] device = \"cuda\""), bf);
  BOOST_TEST(load(kBase, {"--training.mixed_precision_param=bfloat16", "--training.device=cuda"}).validate(1).dp_shard == 1);
  // The same options pass the layout-only rules (meshtrain layout lays out published decks).
  BOOST_TEST(load(kBase, {"--parallelism.tensor_parallel_degree=2"}).validate_layout(8).dp_shard == 4);
  // What is implemented passes: replication, tensor parallelism (with and without sequence
  // parallelism and loss parallelism), full, selective-N and per-operator checkpointing.
  BOOST_TEST(error_of(kBase, {"--parallelism.tensor_parallel_degree=2"}, 8) == "");
  BOOST_TEST(error_of(kBase, {"--parallelism.tensor_parallel_degree=4", "--parallelism.enable_sequence_parallel=false",
                              "--parallelism.disable_loss_parallel=true"}, 4) == "");
  BOOST_TEST(error_of(kBase, {"--parallelism.data_parallel_replicate_degree=2"}, 2) == "");
  BOOST_TEST(error_of(kBase, {"--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=3"}) == "");
  BOOST_TEST(error_of(kBase, {"--activation_checkpoint.mode=full", "--activation_checkpoint.selective_ac_option=op"}) == "");
  BOOST_TEST(error_of(kBase, {"--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op"}) == "");
}

// ---- resolved deck -------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(resolved_deck_round_trips) {
  const JobConfig c = load(kBase, {"--model.n_layers=3", "--lr_scheduler.decay_ratio=0.5", "--optimizer.lr=1.2345678901234567e-4",
                                   "--job.description=a \"quoted\" #hash \\ back\tslash", "--validation.enable=true",
                                   "--model.rope_theta=10000"});
  const std::string text = resolved_deck_toml(c);
  const JobConfig r = load(text);
  auto body = [](const std::string& t) { return t.substr(t.find("\n[")); };  // past the header comment
  BOOST_TEST(body(resolved_deck_toml(r)) == body(text));
  BOOST_TEST(*r.model.n_layers == 3);
  BOOST_TEST(*r.lr_scheduler.decay_ratio == 0.5);
  BOOST_TEST(r.optimizer.lr == 1.2345678901234567e-4);  // exact: shortest round-trip floats
  BOOST_TEST(r.job.description == c.job.description);
  BOOST_TEST(*r.model.rope_theta == 10000.0);
  BOOST_TEST(!r.model.dim.has_value());  // unset stays unset (a comment line)
  BOOST_TEST(has(text, "\n# dim = (flavor)\n"));
  BOOST_TEST(has(text, "\nrope_theta = 10000.0\n"));  // a float stays a float
  BOOST_TEST(r.validate(1).dp_shard == 1);
}

// ---- the repository's decks ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(repository_decks_load_and_validate) {
  const fs::path inputs = fs::path(MESHTRAIN_SOURCE_DIR) / "inputs";
  int n = 0;
  for (const auto& e : fs::directory_iterator(inputs))
    if (e.path().extension() == ".toml") {
      BOOST_TEST_CONTEXT(e.path()) { BOOST_CHECK_NO_THROW(load_job_config(e.path().string(), {})); }
      ++n;
    }
  BOOST_TEST(n >= 2);
  // The default decks run as `make run` launches them: data parallel over NP ranks.
  for (const char* deck : {"llama3_debug.toml", "qwen3_debug.toml"})
    for (int np : {1, 2, 3, 4, 16}) {
      const JobConfig c = load_job_config((inputs / deck).string(), {"--parallelism.data_parallel_replicate_degree=" + std::to_string(np)});
      BOOST_TEST_CONTEXT(deck << " on " << np) {
        BOOST_CHECK_NO_THROW(c.validate(np));
        BOOST_TEST(c.validation.enable);
        BOOST_TEST(c.activation_checkpoint.mode == "none");
      }
    }
  BOOST_TEST(load_job_config((inputs / "llama3_debug.toml").string(), {}).model.name == "llama3");
  BOOST_TEST(load_job_config((inputs / "qwen3_debug.toml").string(), {}).model.name == "qwen3");
}

// Tensor parallelism and MoE: the routed experts are whole on every tp rank, so only the dense
// blocks' FFN and the shared experts' width must leave each tp rank some hidden units.
BOOST_AUTO_TEST_CASE(moe_tp_split_rules_cover_the_shared_experts_only) {
  const std::vector<std::string> moe = {"--model.num_experts=4", "--model.moe_inter_dim=1",
                                        "--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1"};
  std::vector<std::string> ok = moe;
  ok.push_back("--model.ffn_hidden_dim=1");  // no dense block: the dense width is not split
  BOOST_TEST(load(kBase, ok).validate(2).tp == 2);
  std::vector<std::string> shared = moe;
  shared.push_back("--model.num_shared_experts=1");  // one hidden unit over tp 2
  const std::string e = error_of(kBase, shared, 2);
  BOOST_TEST(has(e, "[model] num_shared_experts: num_shared_experts × moe_inter_dim 1 leaves tp rank 1 of 2 nothing"), e);
}

// The output head's z-loss and chunked cross-entropy: bad values stop the run naming the key.
BOOST_AUTO_TEST_CASE(output_z_loss_and_loss_chunk_rules_name_their_key) {
  const std::vector<std::string> shard1 = {"--parallelism.data_parallel_shard_degree=1"};
  auto with = [&](std::string o) { return std::vector<std::string>{o, shard1[0]}; };
  BOOST_TEST(load(kBase, with("--model.loss_chunk_tokens=512")).validate(1).tp == 1);
  BOOST_TEST(load(kBase, with("--model.output_z_loss_coeff=1e-4")).model_args().output_z_loss_coeff == 1e-4);
  std::string e = error_of(kBase, with("--model.output_z_loss_coeff=-0.1"));
  BOOST_TEST(has(e, "[model] output_z_loss_coeff: value -0.1 is out of range (must be >= 0)"), e);
  e = error_of(kBase, with("--model.loss_chunk_tokens=-256"));
  BOOST_TEST(has(e, "[model] loss_chunk_tokens: value -256 is out of range (must be >= 0)"), e);
  e = error_of(kBase, with("--model.loss_chunk_tokens=300"));
  BOOST_TEST(has(e, "[model] loss_chunk_tokens: loss_chunk_tokens 300 is not a multiple of 256"), e);
  // The router's z-loss keeps its own key and meaning.
  BOOST_TEST(load(kBase, with("--model.z_loss_coeff=1e-3")).model_args().output_z_loss_coeff == 0.0);
}
