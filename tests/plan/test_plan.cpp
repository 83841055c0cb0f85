#define BOOST_TEST_MODULE plan
// The planner's parts without a run: the hardware catalog and its errors, the activation replay
// against the per-block formula of activation_model.hpp, the time model's scaling, and run_plan's
// enumeration under --fixed.
#include <boost/test/unit_test.hpp>


#include "config/deck_parser.hpp"
#include "plan/activation_model.hpp"
#include "plan/hardware.hpp"
#include "plan/planner.hpp"
#include "util/errors.hpp"

using namespace meshtrain;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_hardware_catalog(text, "my.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// One valid entry, with `replace` substituted for its line starting with the same key.
std::string entry(const std::string& replace = "") {
  std::string t =
      "[gpu]\ndescription = \"x\"\nsource = \"y\"\npeak_bf16_flops = 1e15\npeak_fp32_flops = 6e13\n"
      "memory_bytes = 8e10\nmemory_bandwidth = 3e12\ndevices_per_node = 8\nintra_node_bandwidth = 4e11\n"
      "inter_node_bandwidth = 5e10\nintra_node_latency_s = 1e-5\ninter_node_latency_s = 2e-5\n"
      "matmul_efficiency = 0.5\nattention_efficiency = 0.4\nmemory_efficiency = 0.5\ncomm_efficiency = 0.8\n"
      "comm_overlap = 0.9\nfragmentation = 0.05\n";
  if (replace.empty()) return t;
  const std::string key = replace.substr(0, replace.find(' '));
  const size_t at = t.find("\n" + key + " ");
  const size_t end = t.find('\n', at + 1);
  return t.substr(0, at + 1) + replace + t.substr(end);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(builtin_catalog_has_every_entry) {
  const auto& c = builtin_hardware();
  for (const char* name : {"a100_40gb", "a100_80gb", "h100_sxm", "h100_pcie", "h100_nvl", "h200", "b200", "gb200", "cpu"}) {
    const HardwareSpec h = find_hardware(name);
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST(h.peak_fp32_flops > 0);
      BOOST_TEST(h.memory_bytes > 0);
      BOOST_TEST(!h.source.empty());
    }
  }
  BOOST_TEST(c.size() == 9u);
  BOOST_TEST(find_hardware("h100_sxm").peak_bf16_flops == 989e12);
  BOOST_TEST(find_hardware("h200").memory_bytes == 141e9);
}

BOOST_AUTO_TEST_CASE(catalog_errors_name_file_line_and_key) {
  BOOST_TEST(error_of(entry()).empty());
  BOOST_TEST(has(error_of(entry("matmul_efficiency = 1.5")), "my.toml:13: [gpu] matmul_efficiency: 1.5 is out of range"));
  BOOST_TEST(has(error_of(entry("memory_bytes = lots")), "my.toml:6: [gpu] memory_bytes: 'lots' is not a number"));
  BOOST_TEST(has(error_of(entry() + "speed = 3\n"), "[gpu] speed: unknown key"));
  BOOST_TEST(has(error_of(entry() + entry()), "[gpu]: defined twice"));
  std::string missing = entry();
  missing.erase(missing.find("comm_overlap"), std::string("comm_overlap = 0.9\n").size());
  BOOST_TEST(has(error_of(missing), "my.toml:1: [gpu] comm_overlap: missing"));
  BOOST_CHECK_THROW(find_hardware("no_such_gpu"), ConfigError);
}

// The replay's bytes kept per block equal the closed form in activation_model.hpp.
BOOST_AUTO_TEST_CASE(activations_per_block_match_the_formula) {
  ModelArgs g = model_flavor("llama3", "debugmodel");  // dim 256, 16 heads, 16 kv heads? use as given
  g.n_kv_heads = 4;
  for (const auto& [tp, sp] : std::vector<std::pair<int64_t, bool>>{{1, true}, {2, true}, {2, false}}) {
    auto kept = [&](int64_t layers) {
      ActivationShape s;
      s.args = g;
      s.args.n_layers = layers;
      s.micro_batch = 2;
      s.seq_len = 64;
      s.tp = tp;
      s.sequence_parallel = sp;
      std::vector<int64_t> blocks;
      for (int64_t i = 0; i < layers; ++i) blocks.push_back(i);
      s.stages = std::make_shared<const std::vector<ActivationShape::Stage>>(
          std::vector<ActivationShape::Stage>{{blocks, true, true}});
      return predict_activations(s)->per_microbatch;
    };
    const int64_t N = 2 * 64, n = tp > 1 && sp ? N / tp : N, D = g.dim;
    const int64_t Q = g.n_heads / tp * g.head_dim, K = g.n_kv_heads / tp * g.head_dim, F = g.ffn_dim() / tp;
    const int64_t formula = 4 * (n * D + N * D + 2 * N * Q + 2 * N * K + n * D + N * D + 3 * N * F) +
                            4 * (2 * n + N * g.n_heads / tp);
    BOOST_TEST_CONTEXT("tp " << tp << (sp ? " sp" : "")) { BOOST_TEST(kept(3) - kept(2) == formula); }
  }
}

BOOST_AUTO_TEST_CASE(plan_of_a_fixed_deck_is_the_deck_and_scales_with_the_batch) {
  const JobConfig base = load_job_config_text(
      "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 1\nglobal_batch_size = 8\n"
      "seq_len = 4096\ndevice = \"cuda\"\nmixed_precision_param = \"bfloat16\"\n[activation_checkpoint]\nmode = \"full\"\n",
      "deck.toml", {});
  PlanOptions o;
  o.devices = 8;
  o.hardware = find_hardware("h100_sxm");
  o.fixed = {"all"};
  const PlanResult r = run_plan(base, o);
  BOOST_TEST(r.enumerated == 1);
  BOOST_TEST_REQUIRE(r.ranked.size() == 1u);
  const PlanCandidate& c = r.ranked.front();
  BOOST_TEST(c.dims.dp_shard == 8);
  BOOST_TEST(c.time.mfu > 0.05);
  BOOST_TEST(c.time.mfu < 0.8);
  // Twice the global batch (gradient accumulation 2): twice the per-micro-batch compute (the
  // optimizer's step, once per step, stays), the same memory.
  JobConfig twice = base;
  twice.training.global_batch_size = 16;
  const PlanResult r2 = run_plan(twice, o);
  BOOST_TEST_REQUIRE(r2.ranked.size() == 1u);
  const double ratio = r2.ranked.front().time.compute_s / c.time.compute_s;
  BOOST_TEST(ratio > 1.9);
  BOOST_TEST(ratio < 2.0);
  BOOST_TEST(r2.ranked.front().memory.total == c.memory.total);
  // Free knobs: many configurations, all judged by validate(); an unknown key is refused.
  o.fixed.clear();
  const PlanResult all = run_plan(base, o);
  BOOST_TEST(all.enumerated > 1000);
  BOOST_TEST(all.valid <= all.enumerated);
  BOOST_TEST(all.fitting <= all.valid);
  BOOST_TEST(!all.best_per_family.empty());
  o.fixed = {"parallelism.tp"};
  BOOST_CHECK_THROW(run_plan(base, o), ConfigError);
}

BOOST_AUTO_TEST_CASE(selective_checkpointing_takes_the_largest_n_that_fits) {
  // 8B (32 blocks) FSDP 8 with only the activation checkpointing free: every N from 2 to 32
  // predicted on its own, then a memory limit between two of them; the search must pick the
  // largest N under it (none does not fit, full recomputes more).
  const JobConfig base = load_job_config_text(
      "[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 2\nglobal_batch_size = 16\n"
      "seq_len = 4096\ndevice = \"cuda\"\nmixed_precision_param = \"bfloat16\"\n[activation_checkpoint]\nmode = \"selective\"\n"
      "selective_ac_option = \"2\"\n",
      "deck.toml", {});
  HardwareSpec hw = find_hardware("h100_sxm");
  std::vector<std::pair<int64_t, int64_t>> total_of;  // (N, predicted total bytes)
  for (int64_t n = 2; n <= 32; ++n) {
    JobConfig d = base;
    d.activation_checkpoint.selective_ac_option = std::to_string(n);
    total_of.emplace_back(n, predict_deck(d, 8, hw).memory.total);
  }
  JobConfig none = base;
  none.activation_checkpoint.mode = "none";
  const int64_t none_total = predict_deck(none, 8, hw).memory.total;
  // A limit halfway between N = 4's total and the next larger total.
  const int64_t at4 = total_of[2].second;
  int64_t above = none_total;
  for (const auto& [n, t] : total_of)
    if (t > at4) above = std::min(above, t);
  BOOST_TEST_REQUIRE(above > at4);
  const double limit = 0.5 * double(at4 + above);
  hw.memory_bytes = limit / (1 - hw.fragmentation);
  int64_t want = 0;
  for (const auto& [n, t] : total_of)
    if (double(t) <= limit) want = n;
  PlanOptions o;
  o.devices = 8;
  o.hardware = hw;
  for (const std::string& k : plan_knobs())
    if (k != "activation_checkpoint.mode") o.fixed.insert(k);
  const PlanResult r = run_plan(base, o);
  BOOST_TEST(r.enumerated == 3);  // none, selective (its N searched), full
  BOOST_TEST_REQUIRE(!r.ranked.empty());
  const PlanCandidate& best = r.ranked.front();
  BOOST_TEST(best.ac_mode == "selective");
  BOOST_TEST(best.ac_option == std::to_string(want));
  BOOST_TEST(want >= 4);
  BOOST_TEST(double(best.memory.total) <= limit);
}
