#include "plan/planner.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <cstdio>
#include <memory>
#include <optional>
#include <string_view>

#include "config/option_registry.hpp"
#include "config/pipeline_plan.hpp"
#include "config/toml_value.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/stage_split.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k * k <= n; ++k)
    if (n % k == 0) {
      out.push_back(k);
      if (k != n / k) out.push_back(n / k);
    }
  std::sort(out.begin(), out.end());
  return out;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(int64_t(1) << 30));
  return buf;
}

const char* kTP = "parallelism.tensor_parallel_degree";
const char* kPP = "parallelism.pipeline_parallel_degree";
const char* kCP = "parallelism.context_parallel_degree";
const char* kEP = "parallelism.expert_parallel_degree";
const char* kDR = "parallelism.data_parallel_replicate_degree";
const char* kDS = "parallelism.data_parallel_shard_degree";
const char* kLB = "training.local_batch_size";
const char* kMB = "parallelism.pipeline_parallel_microbatch_size";
const char* kSched = "parallelism.pipeline_parallel_schedule";
const char* kRot = "parallelism.context_parallel_rotate_method";
const char* kAC = "activation_checkpoint.mode";
const char* kZero = "parallelism.zero_stage";
const char* kReshard = "parallelism.fsdp_reshard_after_forward";
const char* kReduce = "training.mixed_precision_reduce";


// The schedule's position in schedule_names() (−1 for another name), a number for memo keys.
int64_t schedule_index(const std::string& name) {
  const std::vector<std::string>& all = schedule_names();
  const auto it = std::find(all.begin(), all.end(), name);
  return it == all.end() ? -1 : int64_t(it - all.begin());
}

// Selective AC's N values worth trying on `layers` blocks: block b is recomputed when b % N == 0,
// so N recomputes ceil(layers / N) blocks; the first N of each distinct count, count falling
// (memory rising, recomputation falling) from N = 2.
std::vector<int64_t> selective_every(int64_t layers) {
  std::vector<int64_t> out;
  int64_t last = -1;
  for (int64_t n = 2; n <= std::max<int64_t>(layers, 2); ++n) {
    const int64_t count = (layers + n - 1) / n;
    if (count != last) out.push_back(n), last = count;
  }
  return out;
}

}  // namespace

std::string PlanCandidate::family() const {
  std::vector<std::string> parts;
  const int64_t fsdp = dims.dp_shard * dims.cp;
  if (dims.tp > 1) parts.push_back("TP " + std::to_string(dims.tp));
  if (dims.cp > 1) parts.push_back("CP " + std::to_string(dims.cp));
  if (dims.ep > 1) parts.push_back("EP " + std::to_string(dims.ep));
  if (dims.dp_shard > 1 || (fsdp > 1 && dims.dp_replicate > 1)) {
    const std::string name = zero == 3 ? "FSDP" : "ZeRO-" + std::to_string(zero);
    if (dims.dp_replicate > 1)
      parts.push_back("HSDP " + std::to_string(dims.dp_replicate) + " × " + std::to_string(dims.dp_shard) +
                      (zero == 3 ? std::string() : " (ZeRO-" + std::to_string(zero) + ")"));
    else
      parts.push_back(name + " " + std::to_string(dims.dp_shard));
  } else if (dims.dp_replicate > 1) {
    parts.push_back("DDP " + std::to_string(dims.dp_replicate));
  }
  if (dims.pp > 1) parts.push_back("PP " + std::to_string(dims.pp));
  if (parts.empty()) return "single device";
  std::string s;
  for (const std::string& p : parts) s += s.empty() ? p : " × " + p;
  return s;
}

int PlanCandidate::model_dims() const {
  return int(dims.tp > 1) + int(dims.cp > 1) + int(dims.pp > 1) + int(dims.ep > 1);
}

int PlanCandidate::data_dims() const { return int(dims.dp_replicate > 1) + int(dims.dp_shard > 1); }

double PlanCandidate::cross_rack_bytes() const {
  double b = 0;
  for (const CommTime& c : time.comm)
    if (std::string_view(c.tier) == "spine") b += c.bytes;
  return b;
}

std::string PlanCandidate::knobs() const {
  std::string s = "local batch " + std::to_string(local_batch) + ", GA " + std::to_string(grad_accum);
  if (dims.pp > 1) s += ", " + schedule + " mb " + std::to_string(microbatch);
  if (dims.cp > 1) s += ", cp " + rotate;
  s += ac_mode == "none" ? ", no AC" : ac_mode == "full" ? ", full AC" : ", selective AC " + ac_option;
  if (reshard != "default") s += ", reshard " + reshard;
  if (reduce_dtype != "float32") s += ", bf16 reduce";
  return s;
}

std::map<std::string, std::string> PlanCandidate::deck_keys() const {
  std::map<std::string, std::string> k;
  k[kDR] = std::to_string(dims.dp_replicate);
  k[kDS] = std::to_string(dims.dp_shard);
  k[kTP] = std::to_string(dims.tp);
  k[kPP] = std::to_string(dims.pp);
  k[kCP] = std::to_string(dims.cp);
  k[kEP] = std::to_string(dims.ep);
  k[kLB] = std::to_string(local_batch);
  k[kMB] = std::to_string(microbatch);
  k[kSched] = toml::quote(schedule);
  k[kRot] = toml::quote(rotate);
  k[kAC] = toml::quote(ac_mode);
  k["activation_checkpoint.selective_ac_option"] = toml::quote(ac_option);
  k[kZero] = std::to_string(zero);
  k[kReshard] = toml::quote(reshard);
  k[kReduce] = toml::quote(reduce_dtype);
  return k;
}

const std::vector<std::string>& plan_knobs() {
  static const std::vector<std::string> k = {kTP, kPP, kCP, kEP, kDR, kDS, kLB, kMB, kSched, kRot, kAC, kZero,
                                             kReshard, kReduce};
  return k;
}

namespace {
// Sets `c`'s keys on `j` in place (the search reuses one JobConfig: copying a deck's key origins
// and notices per candidate would cost more than predicting it).
void set_keys(JobConfig& j, const PlanCandidate& c) {
  ParallelismSection& p = j.parallelism;
  p.data_parallel_replicate_degree = c.dims.dp_replicate;
  p.data_parallel_shard_degree = c.dims.dp_shard;
  p.tensor_parallel_degree = c.dims.tp;
  p.pipeline_parallel_degree = c.dims.pp;
  p.context_parallel_degree = c.dims.cp;
  p.expert_parallel_degree = c.dims.ep;
  p.pipeline_parallel_microbatch_size = c.microbatch;
  p.pipeline_parallel_schedule = c.schedule;
  p.context_parallel_rotate_method = c.rotate;
  p.zero_stage = c.zero;
  p.fsdp_reshard_after_forward = c.reshard;
  j.training.local_batch_size = c.local_batch;
  j.training.mixed_precision_reduce = c.reduce_dtype;
  j.activation_checkpoint.mode = c.ac_mode;
  j.activation_checkpoint.selective_ac_option = c.ac_option;
}
}  // namespace

JobConfig apply_candidate(const JobConfig& deck, const PlanCandidate& c) {
  JobConfig j = deck;
  set_keys(j, c);
  return j;
}

namespace {

// The rank states of the last (model split, pipeline plan) asked: the candidates of one split
// differ in other knobs (AC, ZeRO stage, dtypes, cp rotation), and rank_states' memo key is long.
struct StatesCache {
  std::array<int64_t, 5> key{};  // tp, ep, fsdp, pp, sequence parallel
  const PipelinePlan* plan = nullptr;  // the search's plans live until it ends
  std::shared_ptr<const std::vector<RankState>> states;
};

// Predicts `c` (its dims already validated for `cfg`): its memory, and its step time when it
// fits or `time_unfitting` (a search needs the time of a configuration that does not fit only
// when it is shown as its family's smallest, and asks again then). Returns whether it timed it.
// The memory total is exact when it fits or lies below `exact_below`, else a lower bound above
// both (predict_memory's stop_above).
bool evaluate(const JobConfig& cfg, PlanCandidate& c, const PipelinePlan* plan, const HardwareSpec& hw, double limit,
              const std::vector<RankPlace>& places, const ModelArgs& args, StatesCache& cache,
              double document_tokens, bool time_unfitting = true,
              int64_t exact_below = std::numeric_limits<int64_t>::max()) {
  const std::array<int64_t, 5> key = {c.dims.tp, c.dims.ep, c.dims.dp_shard * c.dims.cp, c.dims.pp,
                                      int64_t(cfg.parallelism.enable_sequence_parallel)};
  if (!cache.states || cache.key != key || cache.plan != plan) {
    cache.states = rank_states(args, c.dims, plan, cfg.parallelism.enable_sequence_parallel);
    cache.key = key;
    cache.plan = plan;
  }
  std::shared_ptr<const std::vector<RankState>> states;
  std::shared_ptr<const ActivationPrediction> act;
  c.memory = predict_memory(cfg, c.dims, plan, &states, &act, &args, cache.states,
                            std::max(exact_below, int64_t(limit)));
  c.fits = double(c.memory.total) <= limit;
  c.headroom = 1.0 - double(c.memory.total) / limit;
  c.grad_accum = cfg.grad_accum_steps(c.dims);
  if (!c.fits && !time_unfitting) return false;
  c.time = predict_step_time(cfg, c.dims, plan, *states, *act, hw, places, &args, document_tokens);
  return true;
}

PlanCandidate from_deck(const JobConfig& d, const ParallelDims& dims) {
  PlanCandidate c;
  c.dims = dims;
  c.local_batch = d.training.local_batch_size;
  c.microbatch = d.parallelism.pipeline_parallel_microbatch_size;
  c.schedule = d.parallelism.pipeline_parallel_schedule;
  c.rotate = d.parallelism.context_parallel_rotate_method;
  c.ac_mode = d.activation_checkpoint.mode;
  c.ac_option = d.activation_checkpoint.selective_ac_option;
  c.zero = int(d.parallelism.zero_stage);
  c.reshard = d.parallelism.fsdp_reshard_after_forward;
  c.reduce_dtype = d.training.mixed_precision_reduce;
  return c;
}

// Why a configuration does not fit: the total against the limit, and its largest category.
std::string why_not(const PlanCandidate& c, double limit) {
  const MemoryPrediction& m = c.memory;
  std::vector<std::pair<int64_t, std::string>> cats = {{m.parameters, "parameters"},
                                                       {m.gradients, "gradients"},
                                                       {m.optimizer, "optimizer"},
                                                       {m.activations, "activations"},
                                                       {m.communication, "communication"}};
  std::sort(cats.rbegin(), cats.rend());
  return "needs " + gib(double(m.total)) + " > " + gib(limit) + " even at its smallest (" + c.knobs() + "; " +
         cats[0].second + " " + gib(double(cats[0].first)) + ", " + cats[1].second + " " +
         gib(double(cats[1].first)) + ")";
}

}  // namespace

PlanCandidate predict_deck(const JobConfig& deck, int64_t world, const HardwareSpec& hw) {
  const ParallelDims dims = deck.validate(world);
  PipelinePlan plan;
  if (dims.pp > 1) plan = deck.pipeline_plan(dims);
  PlanCandidate c = from_deck(deck, dims);
  StatesCache once;
  evaluate(deck, c, dims.pp > 1 ? &plan : nullptr, hw, hw.memory_bytes * (1 - hw.fragmentation),
           placement_for(deck, world, hw, deck.topology.file), deck.model_args(), once, 0);
  c.risky = c.headroom < 1.0 - PlanOptions{}.pressure;
  return c;
}

PlanResult run_plan(const JobConfig& deck, const PlanOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const HardwareSpec& hw = opts.hardware;
  const int64_t n = opts.devices;
  for (const std::string& k : opts.fixed)
    if (k != "all" && std::find(plan_knobs().begin(), plan_knobs().end(), k) == plan_knobs().end()) {
      std::string known;
      for (const std::string& x : plan_knobs()) known += known.empty() ? x : ", " + x;
      throw ConfigError("--fixed " + k + ": not a key the planner varies (" + known + ", or all)");
    }
  auto fixed = [&](const char* key) { return opts.fixed.count("all") || opts.fixed.count(key); };
  JobConfig base = deck;
  // The global batch is the deck's: with -1, the deck's own layout on n devices defines it.
  if (base.training.global_batch_size <= 0) {
    const ParallelDims own = deck.validate_layout(n);
    base.training.global_batch_size = deck.global_batch(own);
  }
  const int64_t global = base.training.global_batch_size;
  const ModelArgs a = base.model_args();
  const bool bf16 = base.training.mixed_precision_param == "bfloat16";
  const PlanCandidate deck_c = from_deck(deck, ParallelDims{});

  PlanResult res;
  res.memory_limit = hw.memory_bytes * (1 - hw.fragmentation);
  res.error_band = hw.step_time_error;
  // Every fitting configuration within the error band of the fastest seen so far: the final
  // band (of the fastest overall) is a subset, since the fastest only grows. Pruned as it grows.
  std::vector<PlanCandidate> close;
  double best_tps = 0;
  size_t prune_at = 1024;
  const std::vector<RankPlace> places =
      placement_for(deck, n, hw, opts.topology_file.empty() ? deck.topology.file : opts.topology_file);
  JobConfig cfg = base;  // each candidate's keys are set on it in turn
  // The PipelinePlan of a (schedule, pp, micro-batches) key, made once: its stages and schedule
  // are shared by every candidate with that key. Plans of one key differ only in their
  // micro-batch size, set before each use (a copy per size would copy schedules of 10^5
  // actions hundreds of times).
  std::map<std::string, std::shared_ptr<PipelinePlan>> pipeline_plans;
  // Per family: the fastest fitting configuration and the one using the least memory. Families
  // are numbered by name (family() formats a string: it runs once per (degrees, ZeRO stage),
  // and candidates find their family's number by that key).
  struct Family {
    std::optional<PlanCandidate> best, least;
    bool least_timed = false;  // least's step time predicted (else asked once it is shown)
    std::shared_ptr<PipelinePlan> least_plan;  // its micro-batch size set again before use
  };
  // predict_step_time() fails for every configuration of a search or for none (no peak for the
  // deck's dtype, too few placed ranks): once one has been timed, those that do not fit are
  // timed only when shown, and a failure still drops a configuration as it always did.
  bool timed_one = false;
  std::vector<Family> families;
  std::map<std::string, size_t> family_by_name;
  std::map<std::array<int64_t, 7>, size_t> family_of;
  StatesCache states_cache;
  std::map<std::array<int64_t, 3>, std::pair<bool, std::string>> verdicts;  // schedule_verdict's, per key
  const int64_t keep = std::max<int64_t>(opts.top, 1);
  auto faster = [](const PlanCandidate& x, const PlanCandidate& y) {
    return x.time.tokens_per_s_per_device > y.time.tokens_per_s_per_device;
  };

  auto pick = [&](const char* key, std::vector<int64_t> all, int64_t deck_value) {
    return fixed(key) ? std::vector<int64_t>{deck_value} : all;
  };
  auto pick_s = [&](const char* key, std::vector<std::string> all, const std::string& deck_value) {
    return fixed(key) ? std::vector<std::string>{deck_value} : all;
  };
  const std::vector<int64_t> div = divisors(n);
  const std::vector<int64_t> everies = selective_every(a.n_layers);
  const ParallelismSection& dp = deck.parallelism;
  // The inner knobs' lists, made once (the loops below visit them millions of times); each pair:
  // where the knob varies, and where only its deck value applies.
  const std::vector<std::string> scheds_pp = pick_s(
      kSched, {"1F1B", "Interleaved1F1B", "GPipe", "InterleavedZeroBubble", "ZBVZeroBubble"}, dp.pipeline_parallel_schedule);
  const std::vector<std::string> scheds_deck = {dp.pipeline_parallel_schedule};
  const std::vector<std::string> rots_cp = pick_s(kRot, {"allgather", "alltoall"}, dp.context_parallel_rotate_method);
  const std::vector<std::string> rots_deck = {dp.context_parallel_rotate_method};
  const std::vector<int64_t> zeros_sharded = pick(kZero, {3, 2, 1}, dp.zero_stage);
  const std::vector<int64_t> zeros_deck = {dp.zero_stage};
  // "default" reshards after forward without pp and keeps the gathered parameters with it
  // (TorchTitan's rule): "never" differs only without pp.
  const std::vector<std::string> reshards_zero3 = pick_s(kReshard, {"default", "never"}, dp.fsdp_reshard_after_forward);
  const std::vector<std::string> reshards_other = pick_s(kReshard, {"default"}, dp.fsdp_reshard_after_forward);
  const std::vector<std::string> reds_bf16 = pick_s(kReduce, {"float32", "bfloat16"}, deck.training.mixed_precision_reduce);
  const std::vector<std::string> reds_fp32 = pick_s(kReduce, {"float32"}, deck.training.mixed_precision_reduce);
  const std::vector<std::string> acs = pick_s(kAC, {"none", "selective", "full"}, deck.activation_checkpoint.mode);
  for (int64_t tp : pick(kTP, div, dp.tensor_parallel_degree)) {
    if (a.n_kv_heads % tp || a.n_heads % tp) continue;
    for (int64_t pp : pick(kPP, div, dp.pipeline_parallel_degree)) {
      if (n % (tp * pp) || pp > a.n_layers) continue;
      for (int64_t cp : pick(kCP, div, dp.context_parallel_degree)) {
        if (n % (tp * pp * cp) || (cp > 1 && base.training.seq_len % (2 * cp) != 0)) continue;
        const int64_t dpn = n / (tp * pp * cp);
        // validate()'s verdict on sequence parallelism's split, reached without an exception
        // per candidate (the rules before it: the loops' own filters, and the model's heads).
        ParallelDims split_dims;
        split_dims.tp = tp;
        split_dims.cp = cp;
        const bool split_fails = !base.sequence_split_holds(split_dims) && a.n_heads % a.n_kv_heads == 0;
        // Counted under the key validate() names, as its messages are cut below ("[training] seq_len").
        static const std::string seq_reason = [] {
          const std::string label = key_label("training.seq_len");
          return label.substr(0, label.find(':'));
        }();
        for (int64_t dr : pick(kDR, divisors(dpn), dp.data_parallel_replicate_degree)) {
          if (dpn % dr) continue;
          const int64_t ds = dpn / dr;
          if (fixed(kDS) && dp.data_parallel_shard_degree > 0 && ds != dp.data_parallel_shard_degree) continue;
          const int64_t fsdp = ds * cp;
          std::vector<int64_t> eps{1};
          if (a.num_experts > 0) eps = divisors(fsdp);
          for (int64_t ep : pick(kEP, eps, dp.expert_parallel_degree)) {
            if (fsdp % ep || (a.num_experts > 0 && a.num_experts % ep)) continue;
            if (a.num_experts == 0 && ep > 1) continue;
            const int64_t dpw = dr * ds;
            if (global % dpw) continue;
            for (int64_t lb : pick(kLB, divisors(global / dpw), deck.training.local_batch_size)) {
              const std::vector<int64_t> mbs = pp > 1 ? divisors(lb) : std::vector<int64_t>{1};
              for (int64_t mb : pick(kMB, mbs, dp.pipeline_parallel_microbatch_size)) {
                for (const std::string& sched : pp > 1 ? scheds_pp : scheds_deck) {
                  std::shared_ptr<PipelinePlan> sched_plan;  // this key's, once one candidate is valid
                  // The schedule's own rules (m ≥ pp for 1F1B, …) decide many candidates at
                  // once: ask the memoized verdict validate() reaches, before building any.
                  if (pp > 1 && deck.parallelism.pipeline_parallel_schedule_csv.empty()) {
                    // Per (schedule, pp, micro-batches), asked once: the search asks for each
                    // hundreds of thousands of times.
                    const std::array<int64_t, 3> vkey = {schedule_index(sched), pp, lb / mb};
                    auto known = verdicts.find(vkey);
                    if (known == verdicts.end()) {
                      std::string why;
                      bool ok = true;
                      try {
                        const int v = stages_per_rank_for(sched, int(pp), a.n_layers,
                                                          dp.pipeline_parallel_layers_per_stage.value_or(0),
                                                          dp.pipeline_parallel_first_stage_less_layers,
                                                          dp.pipeline_parallel_last_stage_less_layers);
                        ok = schedule_verdict(sched, int(pp), int(lb / mb), v, &why);
                      } catch (const std::exception& e) {
                        ok = false, why = e.what();
                      }
                      known = verdicts.emplace(vkey, std::make_pair(ok, std::move(why))).first;
                    }
                    const auto& [ok, why] = known->second;
                    if (!ok) {
                      // The candidates the loops below would have made: (ZeRO stage, reshard)
                      // pairs are 3 + 1 + 1 (only ZeRO-3 varies the reshard policy).
                      const int64_t zr = fsdp <= 1 ? 1 : fixed(kZero) ? 1 : 3;  // reshard varies only without pp
                      const int64_t inner = (cp > 1 && !fixed(kRot) ? 2 : 1) * zr *
                                            (bf16 && (fsdp > 1 || dr > 1) && !fixed(kReduce) ? 2 : 1) *
                                            (fixed(kAC) ? 1 : 3);
                      res.enumerated += inner;
                      const size_t cut = why.find(':', why.find(']'));
                      res.invalid_reasons[cut == std::string::npos ? why : why.substr(0, cut)] += inner;
                      continue;
                    }
                  }
                  for (const std::string& rot : cp > 1 ? rots_cp : rots_deck) {
                    for (int64_t zero : fsdp > 1 ? zeros_sharded : zeros_deck) {
                      for (const std::string& rs : fsdp > 1 && zero == 3 && pp == 1 ? reshards_zero3 : reshards_other) {
                        for (const std::string& red : bf16 && (fsdp > 1 || dr > 1) ? reds_bf16 : reds_fp32) {
                          bool none_fits = false;  // then selective N > 2 could only be slower
                          for (const std::string& acm : acs) {
                            ++res.enumerated;
                            PlanCandidate c = deck_c;
                            c.dims = ParallelDims{dr, ds, cp, tp, pp, ep};
                            c.local_batch = lb;
                            c.microbatch = mb;
                            c.schedule = sched;
                            c.rotate = rot;
                            c.zero = int(zero);
                            c.reshard = rs;
                            c.reduce_dtype = red;
                            c.ac_mode = acm;
                            if (acm == "selective" && !fixed(kAC)) c.ac_option = "2";
                            if (split_fails) {
                              ++res.invalid_reasons[seq_reason];
                              continue;
                            }
                            set_keys(cfg, c);
                            std::shared_ptr<PipelinePlan> plan;
                            ParallelDims dims;
                            try {
                              dims = cfg.validate(n);
                              if (pp > 1 && !sched_plan) {  // the stages and schedule, made once per key
                                const std::string pkey = sched + "/" + std::to_string(pp) + "/" + std::to_string(lb / mb);
                                auto it = pipeline_plans.find(pkey);
                                if (it == pipeline_plans.end())
                                  it = pipeline_plans.emplace(pkey, std::make_shared<PipelinePlan>(cfg.pipeline_plan(dims))).first;
                                sched_plan = it->second;
                                sched_plan->microbatch_size = mb;
                              }
                              plan = sched_plan;
                            } catch (const ConfigError& e) {
                              std::string msg = e.what();
                              const size_t at = msg.find(": [");
                              if (at != std::string::npos) msg = msg.substr(at + 2);
                              const size_t cut = msg.find(':', msg.find(']'));
                              ++res.invalid_reasons[cut == std::string::npos ? msg : msg.substr(0, cut)];
                              continue;
                            }
                            ++res.valid;
                            c.dims = dims;
                            // family() formats a string; one per (degrees, ZeRO stage).
                            const std::array<int64_t, 7> fam_key = {c.dims.dp_replicate, c.dims.dp_shard, c.dims.cp,
                                                                    c.dims.tp, c.dims.pp, c.dims.ep, c.zero};
                            auto fam_it = family_of.find(fam_key);
                            if (fam_it == family_of.end()) {
                              const auto [by_name, added] = family_by_name.try_emplace(c.family(), families.size());
                              if (added) families.emplace_back();
                              fam_it = family_of.emplace(fam_key, by_name->second).first;
                            }
                            Family& fam = families[fam_it->second];
                            // The exact total of a configuration that does not fit matters only
                            // while it may become its family's smallest (shown when none fits).
                            const int64_t exact_below = fam.best    ? 0
                                                        : fam.least ? fam.least->memory.total
                                                                    : std::numeric_limits<int64_t>::max();
                            bool c_timed = false;
                            try {
                              c_timed = evaluate(cfg, c, plan.get(), hw, res.memory_limit, places, a, states_cache,
                                                 opts.document_tokens, !timed_one, exact_below);
                              timed_one |= c_timed;
                              if (acm == "none") none_fits = c.fits;
                              // Selective AC when no AC does not fit: the largest N that fits
                              // (bisected over the distinct recomputed-block counts, memory
                              // rising with N), the fastest fitting N tried standing for the
                              // configuration.
                              if (acm == "selective" && !fixed(kAC) && c.fits && !none_fits) {
                                size_t lo = 0, hi = everies.size();  // everies[lo] fits, [hi] does not
                                PlanCandidate best = c;
                                while (hi - lo > 1) {
                                  const size_t mid = (lo + hi) / 2;
                                  PlanCandidate t = c;
                                  t.ac_option = std::to_string(everies[mid]);
                                  cfg.activation_checkpoint.selective_ac_option = t.ac_option;
                                  evaluate(cfg, t, plan.get(), hw, res.memory_limit, places, a, states_cache,
                                           opts.document_tokens, !timed_one, 0);
                                  if (!t.fits) {
                                    hi = mid;
                                    continue;
                                  }
                                  lo = mid;
                                  if (faster(t, best)) best = std::move(t);
                                }
                                c = std::move(best);
                              }
                            } catch (const std::exception& e) {
                              ++res.invalid_reasons[std::string("prediction: ") + e.what()];
                              continue;
                            }
                            if (!fam.best && (!fam.least || c.memory.total < fam.least->memory.total)) {
                              fam.least = c;
                              fam.least_timed = c_timed;
                              fam.least_plan = plan;
                            }
                            if (!c.fits) continue;
                            ++res.fitting;
                            c.risky = c.headroom < 1.0 - opts.pressure;
                            res.points.emplace_back(double(c.memory.total), c.time.tokens_per_s_per_device);
                            if (!fam.best || c.time.tokens_per_s_per_device > fam.best->time.tokens_per_s_per_device)
                              fam.best = c;
                            if (c.time.tokens_per_s_per_device >= best_tps * (1 - res.error_band)) {
                              best_tps = std::max(best_tps, c.time.tokens_per_s_per_device);
                              close.push_back(c);
                              if (close.size() >= prune_at) {
                                const double cut = best_tps * (1 - res.error_band);
                                std::erase_if(close, [&](const PlanCandidate& x) { return x.time.tokens_per_s_per_device < cut; });
                                prune_at = std::max<size_t>(1024, 2 * close.size());
                              }
                            }
                            // Keep the `top` fastest: a min-heap on tokens/s.
                            if (int64_t(res.ranked.size()) < keep) {
                              res.ranked.push_back(std::move(c));
                              std::push_heap(res.ranked.begin(), res.ranked.end(), faster);
                            } else if (faster(c, res.ranked.front())) {
                              std::pop_heap(res.ranked.begin(), res.ranked.end(), faster);
                              res.ranked.back() = std::move(c);
                              std::push_heap(res.ranked.begin(), res.ranked.end(), faster);
                            }
                          }
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::sort(res.ranked.begin(), res.ranked.end(), faster);
  if (!res.ranked.empty()) res.fastest.push_back(res.ranked.front());
  // The ties: within the band of the fastest, ordered by simplicity (planner.hpp), then the
  // fastest of the rest.
  const double cut = best_tps * (1 - res.error_band);
  std::erase_if(close, [&](const PlanCandidate& x) { return x.time.tokens_per_s_per_device < cut; });
  for (PlanCandidate& x : close) x.within_error = true;
  auto simpler = [](const PlanCandidate& x, const PlanCandidate& y) {
    if (x.risky != y.risky) return !x.risky;
    if (x.model_dims() != y.model_dims()) return x.model_dims() < y.model_dims();
    if (x.data_dims() != y.data_dims()) return x.data_dims() < y.data_dims();
    const double bx = x.cross_rack_bytes(), by = y.cross_rack_bytes();
    if (bx != by) return bx < by;
    if (x.headroom != y.headroom) return x.headroom > y.headroom;
    return x.time.tokens_per_s_per_device > y.time.tokens_per_s_per_device;
  };
  std::stable_sort(close.begin(), close.end(), simpler);
  if (int64_t(close.size()) > keep) close.resize(size_t(keep));
  for (PlanCandidate& x : res.ranked)
    if (int64_t(close.size()) < keep && x.time.tokens_per_s_per_device < cut) close.push_back(std::move(x));
  res.ranked = std::move(close);
  for (const auto& [name, i] : family_by_name) {  // in name order, as ties in the sorts below were
    if (!families[i].best) continue;
    PlanCandidate& c = *families[i].best;
    c.within_error = c.time.tokens_per_s_per_device >= cut;
    res.best_per_family.push_back(c);
  }
  std::sort(res.best_per_family.begin(), res.best_per_family.end(), faster);
  for (const auto& [name, i] : family_by_name) {
    Family& f = families[i];
    if (f.best || !f.least) continue;
    if (!f.least_timed) {  // predicted as in the search, now with its step time
      set_keys(cfg, *f.least);
      if (f.least_plan) f.least_plan->microbatch_size = f.least->microbatch;
      evaluate(cfg, *f.least, f.least_plan.get(), hw, res.memory_limit, places, a, states_cache, opts.document_tokens);
    }
    res.rejected.emplace_back(*f.least, why_not(*f.least, res.memory_limit));
  }
  std::sort(res.rejected.begin(), res.rejected.end(),
            [](const auto& x, const auto& y) { return x.first.memory.total < y.first.memory.total; });
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace meshtrain
