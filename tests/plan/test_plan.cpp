#define BOOST_TEST_MODULE plan
// The planner's parts without a run: the hardware catalog and its errors, the activation replay
// against the per-block formula of activation_model.hpp, the time model's scaling and shape
// efficiencies, run_plan's enumeration under --fixed, and its rankings: the published layouts
// that must win, ties within the error band ordered by simplicity, memory pressure; document
// masking's attention share, Muon's state, work and traffic, chunked cross-entropy's logits.
#include <boost/test/unit_test.hpp>

#include <string>
#include <tuple>


#include "config/deck_parser.hpp"
#include "plan/activation_model.hpp"
#include "plan/document_mask.hpp"
#include "plan/hardware.hpp"
#include "plan/muon_model.hpp"
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
      "comm_overlap = 0.9\nasync_tp_overlap = 0.22\nfragmentation = 0.05\nsm_count = 132\ngemm_tile = 128\nattention_half_seq = 350\nattention_fall_seq = 0\nattention_fall_floor = 1\n"
      "step_time_error = 0.03\n";
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

namespace {

// A deck of `flavor` (llama3 or qwen3) at `seq` tokens, global batch `global`, bf16 on cuda.
JobConfig gpu_deck(const std::string& model, const std::string& flavor, int64_t seq, int64_t global) {
  return load_job_config_text("[model]\nname = \"" + model + "\"\nflavor = \"" + flavor +
                                  "\"\n[training]\nlocal_batch_size = 1\nglobal_batch_size = " + std::to_string(global) +
                                  "\nseq_len = " + std::to_string(seq) +
                                  "\ndevice = \"cuda\"\nmixed_precision_param = \"bfloat16\"\n[topology]\nranks_per_node = 8\n",
                              "deck.toml", {});
}

PlanResult plan_on(const JobConfig& deck, int64_t gpus, const std::string& hw, int64_t top = 50) {
  PlanOptions o;
  o.devices = gpus;
  o.hardware = find_hardware(hw);
  o.top = top;
  return run_plan(deck, o);
}

}  // namespace

BOOST_AUTO_TEST_CASE(gemm_and_attention_shape_efficiency) {
  const HardwareSpec h = find_hardware("h100_sxm");
  // Whole waves of whole tiles lose nothing; one wave of 64 tiles holds 132 SMs for 64 tiles'
  // work; a ragged tile edge pays for the whole tile.
  BOOST_TEST(gemm_shape_efficiency(132 * 128, 128, h) == 1.0);
  BOOST_TEST(gemm_shape_efficiency(1024, 1024, h) == 64.0 / 132.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(gemm_shape_efficiency(132 * 128 + 1, 128, h) < 0.51);
  // Attention speeds up with the keys per call and saturates; unmasked blocks saturate sooner.
  double last = 0;
  for (double len : {256.0, 512.0, 1024.0, 4096.0, 16384.0}) {
    const double e = attention_length_efficiency(len, true, 128, h);
    BOOST_TEST(e > last);
    BOOST_TEST(e < 1.0);
    BOOST_TEST(attention_length_efficiency(len, false, 128, h) > e);
    last = e;
  }
  BOOST_TEST(attention_length_efficiency(4096, true, 64, h) < attention_length_efficiency(4096, true, 128, h));
}

// The cpu kernel sweeps each query row's keys: past the short lengths its rate falls with the
// keys per row (attention_fall_seq), an unmasked block (every key of the row) falling sooner
// than a causal call of the same length; a fall of 0 leaves the saturating curve as it was.
BOOST_AUTO_TEST_CASE(cpu_attention_falls_with_keys_per_row) {
  const HardwareSpec cpu = find_hardware("cpu");
  BOOST_TEST(cpu.attention_fall_seq > 0);
  double last = 1.0;
  for (double len : {1024.0, 2048.0, 4096.0, 8192.0}) {
    const double e = attention_length_efficiency(len, true, 32, cpu);
    BOOST_TEST(e < last);
    BOOST_TEST(attention_length_efficiency(len, false, 32, cpu) < e);
    last = e;
  }
  HardwareSpec flat = cpu;
  flat.attention_fall_seq = 0;
  BOOST_TEST(attention_length_efficiency(8192, true, 32, flat) >
             4 * attention_length_efficiency(8192, true, 32, cpu));
  BOOST_TEST(find_hardware("h100_sxm").attention_fall_seq == 0);
}

// Context parallelism is not free: the same 8B step on 8 H100 at seq 8192, cut over cp, runs
// slower as cp grows (shorter attention blocks, every block's merge, the ring's exposed hop), at
// the same local rows per GEMM.
BOOST_AUTO_TEST_CASE(context_parallelism_costs_grow_with_cp) {
  double last = 0;
  for (int64_t cp : {1, 2, 4, 8}) {
    JobConfig d = gpu_deck("llama3", "8B", 8192, 8 * cp);
    d.training.local_batch_size = cp;  // the same rows per GEMM: cp samples of seq / cp tokens
    d.parallelism.context_parallel_degree = cp;
    d.parallelism.data_parallel_shard_degree = 8 / cp;
    d.parallelism.context_parallel_rotate_method = "alltoall";
    d.activation_checkpoint.mode = "full";
    const PlanCandidate c = predict_deck(d, 8, find_hardware("h100_sxm"));
    BOOST_TEST_CONTEXT("cp " << cp) {
      BOOST_TEST(c.time.step_s > last);
      if (cp > 1) {
        double cp_bytes = 0;
        for (const CommTime& t : c.time.comm)
          if (std::string(t.dim) == "cp") {
            cp_bytes = t.bytes;
            BOOST_TEST(t.exposed_s > 0);  // the last dK/dV hop is never hidden
            BOOST_TEST(t.exposed_s <= t.seconds);
          }
        BOOST_TEST(cp_bytes > 0);
      }
    }
    last = c.time.step_s;
  }
}

// Async TP (enable_async_tensor_parallel): the same tp bytes and seconds, but the blocks' share
// of them hides behind the fused GEMMs' row blocks; the embedding's and the output head's
// collectives stay exposed, and without sequence parallelism nothing changes.
BOOST_AUTO_TEST_CASE(async_tp_hides_the_blocks_tp_collectives) {
  JobConfig d = gpu_deck("llama3", "70B", 4096, 64);
  d.parallelism.tensor_parallel_degree = 8;
  d.parallelism.data_parallel_shard_degree = 8;
  d.activation_checkpoint.mode = "full";
  const HardwareSpec& hw = find_hardware("h100_sxm");
  auto tp_of = [](const PlanCandidate& c) {
    for (const CommTime& t : c.time.comm)
      if (std::string(t.dim) == "tp") return t;
    return CommTime{};
  };
  const PlanCandidate sync = predict_deck(d, 64, hw);
  d.parallelism.enable_async_tensor_parallel = true;
  const PlanCandidate async = predict_deck(d, 64, hw);
  const CommTime ts = tp_of(sync), ta = tp_of(async);
  BOOST_TEST(ts.seconds > 0);
  BOOST_TEST(ta.seconds == ts.seconds);
  BOOST_TEST(ts.exposed_s == ts.seconds);
  BOOST_TEST(ta.exposed_s < ts.exposed_s);
  // The embedding's and output head's 2 of the 4·80 + 2 collectives per micro-batch stay.
  BOOST_TEST(ta.exposed_s >= ts.seconds * 2.0 / (4.0 * 80 + 2) * (1 - 1e-12));
  BOOST_TEST(async.time.compute_s == sync.time.compute_s);
  BOOST_TEST(async.time.step_s < sync.time.step_s);
  d.parallelism.enable_sequence_parallel = false;
  d.parallelism.enable_async_tensor_parallel = false;
  const double no_sp = tp_of(predict_deck(d, 64, hw)).exposed_s;
  d.parallelism.enable_async_tensor_parallel = true;  // the deck check refuses it; the model ignores it
  BOOST_TEST(tp_of(predict_deck(d, 64, hw)).exposed_s == no_sp);
}

// The acceptance cases: 8B on one node of 8 H100 or 8 GB200 at seq 8192 runs best without
// tp, pp or cp; a 32B dense model (Qwen3-32B) at seq 4096 on 8 GB200 needs tp ≥ 2.
BOOST_AUTO_TEST_CASE(published_node_rankings) {
  for (const char* hw : {"h100_sxm", "gb200"}) {
    const PlanResult r = plan_on(gpu_deck("llama3", "8B", 8192, 16), 8, hw);
    BOOST_TEST_CONTEXT(hw) {
      BOOST_TEST_REQUIRE(!r.ranked.empty());
      const ParallelDims& d = r.ranked.front().dims;
      BOOST_TEST(d.tp == 1);
      BOOST_TEST(d.pp == 1);
      BOOST_TEST(d.cp == 1);
      // Every cp layout is slower than the best without model parallelism, beyond the band.
      for (const PlanCandidate& c : r.best_per_family)
        if (c.dims.cp > 1) BOOST_TEST(!c.within_error);
    }
  }
  const PlanResult q = plan_on(gpu_deck("qwen3", "32B", 4096, 4), 8, "gb200");
  BOOST_TEST_REQUIRE(!q.ranked.empty());
  BOOST_TEST(q.ranked.front().dims.tp >= 2);
}

// Ties: the recommended list starts with every configuration within the band of the fastest
// (marked), ordered by simplicity, then the rest by speed; with no band it is the speed order.
BOOST_AUTO_TEST_CASE(ties_within_the_error_band_are_ordered_by_simplicity) {
  const JobConfig deck = gpu_deck("llama3", "8B", 8192, 16);
  const PlanResult r = plan_on(deck, 8, "h100_sxm", 400);
  BOOST_TEST_REQUIRE(!r.fastest.empty());
  BOOST_TEST(r.error_band == 0.03);
  const double best = r.fastest.front().time.tokens_per_s_per_device, cut = best * (1 - r.error_band);
  bool in_band = true;
  size_t ties = 0;
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const PlanCandidate& c = r.ranked[i];
    BOOST_TEST(c.time.tokens_per_s_per_device <= best);
    BOOST_TEST(c.within_error == (c.time.tokens_per_s_per_device >= cut));
    if (!c.within_error) in_band = false;
    BOOST_TEST(c.within_error == in_band);  // the ties come first
    if (c.within_error) ++ties;
    if (i == 0) continue;
    const PlanCandidate& p = r.ranked[i - 1];
    if (c.within_error) {
      const auto key = [](const PlanCandidate& x) {
        return std::make_tuple(int(x.risky), x.model_dims(), x.data_dims(), x.cross_rack_bytes(), -x.headroom);
      };
      BOOST_TEST((key(p) <= key(c)));
    } else if (!p.within_error) {
      BOOST_TEST(p.time.tokens_per_s_per_device >= c.time.tokens_per_s_per_device);
    }
  }
  BOOST_TEST(ties > 1u);
  BOOST_TEST(!in_band);  // 400 rows reach past the band
  // No band: the speed order, the fastest first.
  PlanOptions o;
  o.devices = 8;
  o.hardware = find_hardware("h100_sxm");
  o.hardware.step_time_error = 0;
  o.top = 20;
  const PlanResult z = run_plan(deck, o);
  BOOST_TEST_REQUIRE(z.ranked.size() == 20u);
  BOOST_TEST(z.ranked.front().time.tokens_per_s_per_device == z.fastest.front().time.tokens_per_s_per_device);
  for (size_t i = 1; i < z.ranked.size(); ++i)
    BOOST_TEST(z.ranked[i - 1].time.tokens_per_s_per_device >= z.ranked[i].time.tokens_per_s_per_device);
}

// Memory pressure: above the threshold a configuration is risky and ranked after the ties with
// headroom; headroom is 1 − total / usable memory.
BOOST_AUTO_TEST_CASE(memory_pressure_ranks_risky_layouts_after_the_ties_with_headroom) {
  const JobConfig deck = gpu_deck("llama3", "8B", 8192, 16);
  PlanOptions o;
  o.devices = 8;
  o.hardware = find_hardware("h100_sxm");
  o.top = 400;
  const double limit = o.hardware.memory_bytes * (1 - o.hardware.fragmentation);
  for (double pressure : {0.8, 0.9, 0.95}) {
    o.pressure = pressure;
    const PlanResult r = run_plan(deck, o);
    BOOST_TEST_CONTEXT("pressure " << pressure) {
      size_t risky = 0, safe = 0;
      bool seen_risky = false;
      for (const PlanCandidate& c : r.ranked) {
        BOOST_TEST(c.headroom == 1 - double(c.memory.total) / limit, boost::test_tools::tolerance(1e-12));
        BOOST_TEST(c.risky == (double(c.memory.total) > pressure * limit));
        if (!c.within_error) break;
        if (c.risky) {
          seen_risky = true;
          ++risky;
        } else {
          ++safe;
          BOOST_TEST(!seen_risky);  // no tie with headroom after a risky one
        }
      }
      BOOST_TEST(risky > 0u);
      BOOST_TEST(safe > 0u);
      BOOST_TEST(!r.ranked.front().risky);
    }
  }
}

namespace {
// Options that predict the deck's own configuration (--fixed all) on `gpus` × `hw`.
PlanOptions deck_only(int64_t gpus, const std::string& hw) {
  PlanOptions o;
  o.devices = gpus;
  o.hardware = find_hardware(hw);
  o.fixed = {"all"};
  return o;
}
}  // namespace

BOOST_AUTO_TEST_CASE(document_masking_attention_follows_the_documents) {
  // The two branches meet at doc = window (2/3 of the causal pairs); Brown's 3,859-token
  // documents in 8k and 32k windows leave the shares perf/block_causal_bench measured on the
  // store (39.6% and 11.3%).
  BOOST_TEST(document_attention_share(8192, 8192) == 2.0 / 3.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(document_attention_share(0, 8192) == 1.0);
  BOOST_TEST(document_attention_share(3859, 8192) == 0.397, boost::test_tools::tolerance(0.005));
  BOOST_TEST(document_attention_share(3859, 32768) == 0.113, boost::test_tools::tolerance(0.01));
  BOOST_TEST(document_attention_share(1e9, 8192) > 0.999);
  BOOST_TEST(token_weighted_document_tokens({0, 100, 400}) == (100.0 * 100 + 300 * 300) / 400);
  BOOST_TEST(token_weighted_document_tokens({}) == 0.0);
  // The time follows the mask, the MFU keeps the causal count: a faster step, a higher MFU.
  JobConfig d = gpu_deck("llama3", "8B", 8192, 8);
  d.activation_checkpoint.mode = "full";
  PlanOptions o = deck_only(8, "h100_sxm");
  const PlanCandidate causal = run_plan(d, o).ranked.at(0);
  o.document_tokens = 2048;
  BOOST_TEST(run_plan(d, o).ranked.at(0).time.step_s == causal.time.step_s);  // causal deck: ignored
  d.model.attn_mask_type = "block_causal";
  const PlanCandidate masked = run_plan(d, o).ranked.at(0);
  BOOST_TEST(masked.time.compute_s < causal.time.compute_s);
  BOOST_TEST(masked.time.mfu > causal.time.mfu);
  BOOST_TEST(masked.memory.total == causal.memory.total);
}

BOOST_AUTO_TEST_CASE(muon_state_work_and_traffic) {
  // 8B: per block wq, wk, wv, wo and w1, w3, w2 (7 matrices); Newton–Schulz of a 4096² matrix:
  // 5 · (4 + 2) · 4096³ FLOPs.
  JobConfig d = gpu_deck("llama3", "8B", 4096, 8);
  const ModelArgs a = d.model_args();
  BOOST_TEST(muon_matrices(a, 0).size() == 7u);
  BOOST_TEST(newton_schulz_flops(4096, 4096, 5) == 30.0 * 4096.0 * 4096.0 * 4096.0);
  BOOST_TEST(newton_schulz_flops(1024, 4096, 1) == newton_schulz_flops(4096, 1024, 1));
  d.activation_checkpoint.mode = "full";
  PlanOptions o = deck_only(8, "h100_sxm");
  const PlanCandidate adamw = run_plan(d, o).ranked.at(0);
  d.optimizer.name = "Muon";
  const PlanCandidate muon = run_plan(d, o).ranked.at(0);
  // FSDP 8: the matrices' state drops from 8 to 4 bytes per element of the shard (about 7 of the
  // 8 billion parameters are in matrices).
  const double saved = double(adamw.memory.optimizer - muon.memory.optimizer);
  BOOST_TEST(saved / double(adamw.memory.optimizer) > 0.4);
  BOOST_TEST(saved / double(adamw.memory.optimizer) < 0.5);
  BOOST_TEST(muon.time.muon_s > 0);
  BOOST_TEST(muon.time.step_s > adamw.time.step_s);
  double bytes = -1;
  for (const CommTime& t : muon.time.comm)
    if (std::string(t.dim) == "muon") {
      bytes = t.bytes;
      BOOST_TEST(t.exposed_s == t.seconds);  // after the backwards: nothing to hide behind
    }
  // Each rank sends and receives its float32 shard of the matrices: 2 · 4 · (≈ 7e9 / 8) · 7/8.
  BOOST_TEST(bytes > 2 * 4 * 6.5e9 / 8 * 7 / 8);
  BOOST_TEST(bytes < 2 * 4 * 7.5e9 / 8 * 7 / 8);
  // Replicated (DDP): every rank orthogonalizes every matrix itself, no traffic, 8× the work.
  d.parallelism.data_parallel_shard_degree = 1;
  d.parallelism.data_parallel_replicate_degree = 8;
  const PlanCandidate ddp = predict_deck(d, 8, find_hardware("h100_sxm"));
  for (const CommTime& t : ddp.time.comm) BOOST_TEST(std::string(t.dim) != "muon");
  BOOST_TEST(ddp.time.muon_s / muon.time.muon_s == 8.0, boost::test_tools::tolerance(0.01));
}

BOOST_AUTO_TEST_CASE(chunked_cross_entropy_keeps_a_chunk_of_logits) {
  // The debug model with a 32k vocabulary, 2,048 tokens per micro-batch (float32): the forward
  // keeps lse [N] instead of the [N, V] logits, and the peak (at the head, where the logits
  // dominate) holds a [C, V] chunk instead of them (tests/plan/memory_accuracy.py checks the
  // same against the allocator's measured peaks).
  auto predict = [](int64_t chunk) {
    ActivationShape s;
    s.args = model_flavor("llama3", "debugmodel");
    s.args.vocab_size = 32768;
    s.args.n_layers = 1;
    s.args.loss_chunk_tokens = chunk;
    s.micro_batch = 8;
    s.seq_len = 256;
    s.stages = std::make_shared<const std::vector<ActivationShape::Stage>>(
        std::vector<ActivationShape::Stage>{{{0}, true, true}});
    return predict_activations(s);
  };
  const int64_t N = 8 * 256, V = 32768, C = 512;
  const auto whole = predict(0), chunked = predict(C), same = predict(N);  // a chunk of N: unchunked
  BOOST_TEST(whole->per_microbatch - chunked->per_microbatch == N * V * 4 - N * 4);
  // (The two peaks fall in different phases of the head, a few [N, D] buffers apart.)
  BOOST_TEST(whole->peak - chunked->peak >= N * V * 4 - N * 4 - C * V * 4);
  BOOST_TEST(whole->peak - chunked->peak <= N * V * 4);
  BOOST_TEST(same->peak == whole->peak);
  // Backward recomputes each chunk's logits: one more head GEMM per micro-batch.
  JobConfig d = gpu_deck("llama3", "8B", 4096, 64);
  d.training.local_batch_size = 8;
  d.activation_checkpoint.mode = "full";
  const HardwareSpec hw = find_hardware("h200");
  const PlanCandidate plain = predict_deck(d, 8, hw);
  d.model.loss_chunk_tokens = 1024;
  const PlanCandidate chunks = predict_deck(d, 8, hw);
  BOOST_TEST(chunks.time.compute_s > plain.time.compute_s);
  BOOST_TEST(chunks.memory.activations < plain.memory.activations);
}
