// The [parallelism] pipeline_parallel_* keys and JobConfig::pipeline_plan(): defaults, the stage
// split of the debug model (6 blocks) under TorchTitan's rule, the schedule, and one error per
// rule naming the deck line of the key at fault.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "config/option_registry.hpp"
#include "config/pipeline_plan.hpp"
#include "config_test_util.hpp"
#include "parallel/pipeline/schedule_csv.hpp"

using namespace meshtrain;
using namespace config_test;

namespace {

// kBase ends in [parallelism]: `keys` land on lines 13, 14, ... of that section.
std::string pp_deck(const std::string& keys) { return std::string(kBase) + keys; }

// The plan of `text` + `overrides` on `world` ranks, with the degrees validate_layout() resolves
// (validate() itself still refuses pp > 1 once the plan passes).
PipelinePlan plan_of(const std::string& text, const std::vector<std::string>& overrides, int64_t world) {
  const JobConfig c = load(text, overrides);
  return c.pipeline_plan(c.validate_layout(world));
}

std::vector<std::string> described(const PipelinePlan& p) {
  std::vector<std::string> out;
  for (const StageLayers& s : p.stages) out.push_back(describe(s));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(pipeline_plan)

BOOST_AUTO_TEST_CASE(defaults_are_torchtitans) {
  const ParallelismSection p = JobConfig{}.parallelism;
  BOOST_TEST(p.pipeline_parallel_schedule == "1F1B");
  BOOST_TEST(p.pipeline_parallel_schedule_csv.empty());
  BOOST_TEST(p.pipeline_parallel_microbatch_size == 1);
  BOOST_TEST(!p.pipeline_parallel_layers_per_stage.has_value());
  BOOST_TEST(p.pipeline_parallel_first_stage_less_layers == 1);
  BOOST_TEST(p.pipeline_parallel_last_stage_less_layers == 1);
  BOOST_TEST(find_option("parallelism.pipeline_parallel_layers_per_stage")->default_text == "(unset)");
  BOOST_TEST(find_option("parallelism.pipeline_parallel_schedule")->allowed ==
             "GPipe | 1F1B | Interleaved1F1B | InterleavedZeroBubble | ZBVZeroBubble");
  BOOST_TEST(has(error_of(pp_deck("pipeline_parallel_schedule = \"DualPipeV\"\n")),
                 ".toml:13: [parallelism] pipeline_parallel_schedule: value \"DualPipeV\" is not allowed"));
  BOOST_TEST(has(error_of(kBase, {"--parallelism.pipeline_parallel_layers_per_stage=0"}),
                 "[parallelism] pipeline_parallel_layers_per_stage: value 0 is out of range (must be >= 1)"));
}

BOOST_AUTO_TEST_CASE(pp_1_is_one_stage_and_ignores_the_pp_keys) {
  // TorchTitan reads the pipeline keys only when pp > 1: a CSV path that is no file is unused.
  const std::string deck = pp_deck("pipeline_parallel_schedule_csv = \"no_such_schedule.csv\"\n");
  const PipelinePlan p = plan_of(deck, {}, 1);
  BOOST_TEST(p.stages.size() == 1u);
  BOOST_TEST(describe(p.stages[0]) == "embedding + layers 0-5 + norm/output");
  BOOST_TEST(p.microbatch_size == 2);  // the whole local batch
  BOOST_TEST(p.microbatches == 1);
  BOOST_TEST(p.schedule.ranks.empty());
  BOOST_TEST(error_of(deck) == "");
}

BOOST_AUTO_TEST_CASE(pp_2_1f1b_splits_the_debug_model_as_torchtitan) {
  // 6 blocks + 1 (embedding) + 1 (norm/output) = 8 effective layers, 4 per stage: 3 + 3 blocks.
  const PipelinePlan p = plan_of(pp_deck("pipeline_parallel_degree = 2\npipeline_parallel_schedule = \"1F1B\"\n"), {}, 2);
  BOOST_TEST(described(p) == (std::vector<std::string>{"embedding + layers 0-2", "layers 3-5 + norm/output"}),
             boost::test_tools::per_element());
  BOOST_TEST(p.stages[1].first_layer == 3);
  BOOST_TEST(p.microbatch_size == 1);
  BOOST_TEST(p.microbatches == 2);  // local_batch_size 2 / 1
  BOOST_TEST(p.schedule.name == "1F1B");
  BOOST_TEST(p.schedule.pp == 2);
  BOOST_TEST(p.schedule.num_stages() == 2);
  BOOST_TEST(p.schedule.microbatches == 2);
  BOOST_TEST((p.schedule.ranks == make_schedule("1F1B", 2, 2, 1).ranks));
  // Micro-batches of 2 samples out of 4: m = 2.
  const PipelinePlan q = plan_of(kBase, {"--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=4",
                                         "--parallelism.pipeline_parallel_microbatch_size=2"}, 2);
  BOOST_TEST(q.microbatch_size == 2);
  BOOST_TEST(q.microbatches == 2);
}

BOOST_AUTO_TEST_CASE(interleaved_schedules_get_two_stages_per_rank) {
  const PipelinePlan p = plan_of(pp_deck("pipeline_parallel_degree = 2\npipeline_parallel_schedule = \"Interleaved1F1B\"\n"), {}, 2);
  BOOST_TEST(described(p) == (std::vector<std::string>{"embedding + layer 0", "layers 1-2", "layers 3-4",
                                                       "layer 5 + norm/output"}),
             boost::test_tools::per_element());
  BOOST_TEST(p.schedule.stages_per_rank == 2);
  BOOST_TEST((p.schedule.stages_of(0) == std::vector<int>{0, 2}));  // loop placement
  // ZB-V folds the same 4 stages into a V: rank 0 holds the first and the last.
  const PipelinePlan v = plan_of(kBase, {"--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=4",
                                         "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble"}, 2);
  BOOST_TEST((v.schedule.stages_of(0) == std::vector<int>{0, 3}));
  // layers_per_stage 1: 8 stages of one effective layer; the embedding and the head stand alone.
  const PipelinePlan one = plan_of(kBase, {"--parallelism.pipeline_parallel_degree=2",
                                           "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                                           "--parallelism.pipeline_parallel_layers_per_stage=1"}, 2);
  BOOST_TEST(one.stages.size() == 8u);
  BOOST_TEST(one.schedule.stages_per_rank == 4);
  BOOST_TEST(describe(one.stages.front()) == "embedding");
  BOOST_TEST(describe(one.stages[1]) == "layer 0");
  BOOST_TEST(describe(one.stages.back()) == "norm/output");
}

BOOST_AUTO_TEST_CASE(split_errors_name_their_key_in_validate_and_layout) {
  // ⌈8 / 3⌉ = 3 stages do not divide over pp 2 (TorchTitan's pipeline_llm rule).
  const std::string three = pp_deck("pipeline_parallel_degree = 2\npipeline_parallel_layers_per_stage = 3\n");
  const std::string e = error_of(three, {}, 2);
  BOOST_TEST(has(e, ".toml:14: [parallelism] pipeline_parallel_layers_per_stage = 3: 6 layers + 1 + 1 for the "
                    "embedding and the output give 3 stages of at most 3, which does not divide by "
                    "pipeline_parallel_degree 2"), e);
  BOOST_CHECK_EXCEPTION(load(three).validate_layout(2), ConfigError,
                        [](const ConfigError& x) { return has(x.what(), "pipeline_parallel_layers_per_stage = 3"); });
  // 4 stages are 2 per rank, but 1F1B runs one.
  BOOST_TEST(has(error_of(three, {"--parallelism.pipeline_parallel_layers_per_stage=2"}, 2),
                 "command line: [parallelism] pipeline_parallel_layers_per_stage = 2: "));
  BOOST_TEST(has(error_of(three, {"--parallelism.pipeline_parallel_layers_per_stage=2"}, 2),
                 "but 1F1B runs one stage per rank"));
  // 16 stages for 8 effective layers: the check that replaced "pp exceeds n_layers".
  const std::string many = error_of(kBase, {"--parallelism.pipeline_parallel_degree=16"}, 16);
  BOOST_TEST(has(many, "[parallelism] pipeline_parallel_degree: 16 stages for 8 effective layers"), many);
  // The embedding weighs 3 layers, more than the smallest stage's 2 of (6 + 3 + 1) / 4.
  BOOST_TEST(has(error_of(pp_deck("pipeline_parallel_first_stage_less_layers = 3\n"),
                          {"--parallelism.pipeline_parallel_degree=4", "--training.local_batch_size=4"}, 4),
                 ".toml:13: [parallelism] pipeline_parallel_first_stage_less_layers = 3 exceeds the 2 layers of the "
                 "smallest stage"));
}

BOOST_AUTO_TEST_CASE(micro_batch_errors_name_pipeline_parallel_microbatch_size) {
  // 1F1B on pp 4 with local_batch_size 2: m = 2 < pp.
  const std::string e = error_of(pp_deck("pipeline_parallel_microbatch_size = 1\n"),
                                 {"--parallelism.pipeline_parallel_degree=4"}, 4);
  BOOST_TEST(has(e, ".toml:13: [parallelism] pipeline_parallel_microbatch_size: schedule 1F1B with pp = 4 got 2 "
                    "micro-batches per step; 1F1B needs micro-batches ≥ pp"), e);
  // Unset, the key is named at the deck (where it would go).
  const JobConfig c = load(kBase, {"--parallelism.pipeline_parallel_degree=4"});
  BOOST_CHECK_EXCEPTION(c.pipeline_plan(c.validate_layout(4)), ConfigError, [&](const ConfigError& x) {
    return std::string(x.what()).starts_with(c.deck_path + ": [parallelism] pipeline_parallel_microbatch_size:");
  });
  // local_batch_size 2 is not a whole number of micro-batches of 3.
  BOOST_TEST(has(error_of(pp_deck("pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 3\n"), {}, 2),
                 ".toml:14: [parallelism] pipeline_parallel_microbatch_size: 3 does not divide [training] "
                 "local_batch_size 2 (micro-batches per round = local_batch_size / pipeline_parallel_microbatch_size)"));
  // Interleaved1F1B needs m a multiple of pp (Megatron-LM): 2 micro-batches on pp 4 are not.
  const std::string i = error_of(kBase, {"--parallelism.pipeline_parallel_degree=4", "--model.n_layers=14",
                                          "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"}, 4);
  BOOST_TEST(has(i, "[parallelism] pipeline_parallel_microbatch_size: schedule Interleaved1F1B with pp = 4 got 2 "
                    "micro-batches per step; interleaved schedules need micro-batches to be a multiple of pp"), i);
}

BOOST_AUTO_TEST_CASE(a_csv_file_replaces_the_generated_actions) {
  // GPipe's order in the file while the deck names 1F1B: the file's actions run.
  const std::string gpipe = write_deck(write_schedule_csv(make_schedule("GPipe", 2, 2, 1), false), ".csv");
  const std::string deck = pp_deck("pipeline_parallel_degree = 2\npipeline_parallel_schedule_csv = \"" + gpipe + "\"\n");
  const PipelinePlan p = plan_of(deck, {}, 2);
  BOOST_TEST(p.schedule.name == "csv");
  BOOST_TEST((p.schedule.ranks == make_schedule("GPipe", 2, 2, 1).ranks));
  BOOST_TEST(p.stages.size() == 2u);
  // The generators' rules on m do not bind a file (TorchTitan's _PipelineScheduleRuntime has
  // none): one micro-batch on pp 2, which generated 1F1B refuses.
  const std::string one = write_deck(write_schedule_csv(make_schedule("GPipe", 2, 1, 1), true), ".csv");
  BOOST_TEST(plan_of(deck, {"--training.local_batch_size=1", "--parallelism.pipeline_parallel_schedule_csv=" + one}, 2)
                 .microbatches == 1);
  BOOST_TEST(has(error_of(deck, {"--training.local_batch_size=1", "--parallelism.pipeline_parallel_schedule_csv="}, 2),
                 "1F1B needs micro-batches ≥ pp"));
}

BOOST_AUTO_TEST_CASE(csv_errors_name_pipeline_parallel_schedule_csv) {
  const std::string key = ".toml:14: [parallelism] pipeline_parallel_schedule_csv: ";
  auto deck = [](const std::string& path) {
    return pp_deck("pipeline_parallel_degree = 2\npipeline_parallel_schedule_csv = \"" + path + "\"\n");
  };
  BOOST_TEST(has(error_of(deck("no_such_schedule.csv"), {}, 2),
                 key + "'no_such_schedule.csv' does not exist or is not a file"));
  // A malformed action: the file's line, then what the deck expects.
  const std::string bad = write_deck("0F0,0X1\n1F0,1B0\n", ".csv");
  const std::string e = error_of(deck(bad), {}, 2);
  BOOST_TEST(has(e, key + bad + ":1: rank 0: action '0X1'"), e);
  BOOST_TEST(has(e, "(the deck gives pp 2 × 1 stage per rank (1F1B) = 2 stages and 2 micro-batches per round"), e);
  // Micro-batches: the file schedules 2, local_batch_size 4 makes 4.
  const std::string two = write_deck(write_schedule_csv(make_schedule("1F1B", 2, 2, 1), false), ".csv");
  BOOST_TEST(has(error_of(deck(two), {"--training.local_batch_size=4"}, 2),
                 key + two + " schedules 2 micro-batches, but the deck gives pp 2 × 1 stage per rank (1F1B) = 2 "
                             "stages and 4 micro-batches per round"));
  // Ranks: a pp 2 file for a pp 4 deck.
  BOOST_TEST(has(error_of(deck(two), {"--parallelism.pipeline_parallel_degree=4"}, 4),
                 key + two + " has 2 rank lines, but the deck gives pp 4 × 1 stage per rank (1F1B) = 4 stages"));
  // Stages: a one-stage-per-rank file where Interleaved1F1B places two per rank.
  const std::string s = error_of(deck(two), {"--parallelism.pipeline_parallel_schedule=Interleaved1F1B"}, 2);
  BOOST_TEST(has(s, key + two + ": "), s);
  BOOST_TEST(has(s, "pp 2 × 2 stages per rank (Interleaved1F1B) = 4 stages"), s);
}

BOOST_AUTO_TEST_SUITE_END()
