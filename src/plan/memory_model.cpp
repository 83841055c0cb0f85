#include "plan/memory_model.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <initializer_list>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "graph/executor.hpp"
#include "model/parameter_catalog.hpp"
#include "parallel/pipeline/simulate.hpp"
#include "parallel/tp_grads.hpp"
#include "plan/activation_model.hpp"
#include "plan/muon_model.hpp"

namespace meshtrain {

namespace {

int64_t a16(int64_t x) { return (x + 15) / 16 * 16; }

// A memo key: `head`, then each value after a '/' (appended in place: concatenating temporaries
// trips GCC 12's -Wrestrict false positive).
std::string key_of(const std::string& head, std::initializer_list<int64_t> values) {
  std::string k = head;
  for (int64_t v : values) {
    k += '/';
    k += std::to_string(v);
  }
  return k;
}

// The model's shape as a memo key.
std::string model_key(const ModelArgs& a) {
  std::string k = a.name;
  k += '/';
  k += a.flavor;
  return key_of(k, {a.dim, a.n_layers, a.vocab_size, a.ffn_dim(), a.num_experts, a.moe_inter_dim,
                    a.num_shared_experts, a.n_heads, a.n_kv_heads, a.head_dim, int64_t(a.qk_norm),
                    int64_t(a.tie_word_embeddings), a.n_dense_layers, a.moe_layer_step, a.top_k});
}

// FNV-1a over a memo key's integers.
struct IntsHash {
  template <class Ints>
  size_t operator()(const Ints& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ uint64_t(x)) * 1099511628211ull;
    return size_t(h);
  }
};

// A number per distinct string (schedule names in memo keys), stable for the process.
int64_t intern(const std::string& s) {
  static std::mutex mu;
  static std::map<std::string, int64_t, std::less<>> ids;
  std::lock_guard<std::mutex> lock(mu);
  auto it = ids.find(s);
  if (it == ids.end()) it = ids.emplace(s, int64_t(ids.size()) + 1).first;
  return it->second;
}

// A number per distinct model shape (model_key), stable for the process. The last model asked
// is remembered per thread by its fields, so the planner's calls (one model) format no key.
int64_t model_id(const ModelArgs& a) {
  struct Last {
    std::string name, flavor;
    std::array<int64_t, 15> v{};
    int64_t id = 0;
  };
  thread_local Last last;
  const std::array<int64_t, 15> v = {a.dim, a.n_layers, a.vocab_size, a.ffn_dim(), a.num_experts, a.moe_inter_dim,
                                     a.num_shared_experts, a.n_heads, a.n_kv_heads, a.head_dim, int64_t(a.qk_norm),
                                     int64_t(a.tie_word_embeddings), a.n_dense_layers, a.moe_layer_step, a.top_k};
  if (last.id > 0 && last.v == v && last.name == a.name && last.flavor == a.flavor) return last.id;
  last.name = a.name;
  last.flavor = a.flavor;
  last.v = v;
  last.id = intern(model_key(a));
  return last.id;
}

// One parameter as a rank holds it: rows × row elements (tp-local, experts split over ep).
struct Held {
  int64_t rows = 0, cols = 1;
  bool expert = false;
  bool tp_partial = false;  // its gradient is summed over tp after backward (tp_grads)
  int64_t block = -1;  // -1: embedding or head
  bool embedding = false, head = false;
  bool matrix = false;  // a 2-D (experts: 3-D) weight of a block: Muon's, under Muon
};

// The tp-local parameters of the whole model (tp rank 0, which holds the most), cached per
// (model, tp, ep): the catalog walks every parameter name, and the planner asks often.
const std::vector<Held>& held_parameters(const ModelArgs& args, int64_t tp, int64_t ep, bool sp) {
  static std::mutex mu;
  static std::map<std::string, std::vector<Held>> cache;
  const std::string key = key_of(model_key(args), {tp, ep, int64_t(sp)});
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  TensorParallel t;
  t.size = tp;
  t.rank = 0;
  t.sequence_parallel = sp;
  const ParameterCatalog cat(args, t);
  std::vector<Held> out;
  for (const CatalogEntry& e : cat.entries()) {
    const Parameter& p = e.meta;
    Held h;
    h.block = e.block;
    h.expert = p.name.find(".experts.w") != std::string::npos;
    h.rows = p.local_shape.empty() ? 1 : p.local_shape[0];
    if (h.expert) h.rows /= ep;
    for (size_t k = 1; k < p.local_shape.size(); ++k) h.cols *= p.local_shape[k];
    h.embedding = p.name == "tok_embeddings.weight";
    h.tp_partial = tp > 1 && p.sharding.tp_partial_grad;
    h.head = e.block < 0 && !h.embedding;
    h.matrix = e.block >= 0 && p.local_shape.size() >= 2;
    out.push_back(h);
  }
  return cache.emplace(key, std::move(out)).first->second;
}

// What one pp rank runs.
struct Part {
  std::vector<int64_t> blocks;
  bool embedding = true, head = true;
  std::vector<ActivationShape::Stage> stages;
};

std::vector<Part> parts_of(const ModelArgs& args, const PipelinePlan* plan) {
  if (!plan || plan->schedule.pp <= 1) {
    Part whole;
    for (int64_t i = 0; i < args.n_layers; ++i) whole.blocks.push_back(i);
    whole.stages = {ActivationShape::Stage{whole.blocks, true, true}};
    return {whole};
  }
  std::vector<Part> parts(size_t(plan->schedule.pp));
  for (int r = 0; r < plan->schedule.pp; ++r) {
    Part& p = parts[size_t(r)];
    p.embedding = p.head = false;
    for (int st : plan->schedule.stages_of(r)) {
      const StageLayers& s = plan->stages[size_t(st)];
      ActivationShape::Stage stage{{}, s.embedding, s.head};
      for (int64_t i = 0; i < s.num_layers; ++i) stage.blocks.push_back(s.first_layer + i);
      p.blocks.insert(p.blocks.end(), stage.blocks.begin(), stage.blocks.end());
      p.stages.push_back(std::move(stage));
      p.embedding |= s.embedding;
      p.head |= s.head;
    }
    std::sort(p.blocks.begin(), p.blocks.end());
  }
  return parts;
}

// What the simulator says each pp rank holds, cached per schedule.
struct Flight {
  std::vector<int> peak;  // [pp] peak in-flight stage micro-batches
  using States = std::shared_ptr<const std::vector<SimulationResult::InFlightState>>;
  std::vector<States> states;  // [pp] SimulationResult::in_flight_states
  std::vector<int64_t> ids;    // [pp] ActivationShape::states_id of each (unique per content and process)
};
const Flight& in_flight(const PipelinePlan& plan) {
  static std::mutex mu;
  static auto& cache = *new std::map<std::string, std::shared_ptr<const Flight>>;  // never destroyed (exit)
  const PipelineSchedule& s = plan.schedule;
  const std::string key = key_of(s.name, {s.pp, s.stages_per_rank, plan.microbatches});
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return *it->second;
  }
  const SimulationResult sim = simulate_schedule(s, {}, /*in_flight_states=*/true, /*timeline=*/false);
  auto f = std::make_shared<Flight>();
  f->peak = sim.peak_in_flight;
  std::lock_guard<std::mutex> lock(mu);
  // Ids name contents: ranks with equal lists share one (so they share predictions), and the
  // cache never erases, so an id never names two contents.
  static int64_t next_id = 0;
  // Lists are compared only when their hashes agree: a pp 64 schedule's ranks hold lists of
  // hundreds of states, and comparing each with every earlier one cost more than simulating.
  auto hash_of = [](const std::vector<SimulationResult::InFlightState>& list) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](int64_t x) { h = (h ^ uint64_t(x)) * 1099511628211ull; };
    for (const SimulationResult::InFlightState& st : list) {
      mix(st.running);
      mix(int64_t(st.phase));
      for (int x : st.held) mix(x);
      for (int x : st.pending) mix(x);
      for (char x : st.backed) mix(x);
    }
    return h;
  };
  std::vector<uint64_t> hashes;
  auto add = [&](const std::vector<std::vector<SimulationResult::InFlightState>>& lists, size_t r,
                 std::vector<Flight::States>& states, std::vector<int64_t>& ids) {
    hashes.push_back(hash_of(lists[r]));
    for (size_t q = 0; q < r; ++q)
      if (hashes[q] == hashes[r] && *states[q] == lists[r]) {
        states.push_back(states[q]);
        ids.push_back(ids[q]);
        return;
      }
    states.push_back(std::make_shared<const std::vector<SimulationResult::InFlightState>>(lists[r]));
    ids.push_back(++next_id);
  };
  for (size_t r = 0; r < sim.in_flight_states.size(); ++r) add(sim.in_flight_states, r, f->states, f->ids);
  return *cache.emplace(key, std::move(f)).first->second;  // entries are never erased: references stay valid
}

// The catalog indices of the parameters each part of the model holds: a pp 64 split places a
// 405B model's thousand parameters on 64 ranks, and a scan of the whole catalog per rank cost
// more than the rest of the split.
struct HeldIndex {
  std::vector<std::vector<size_t>> by_block;  // [block]
  std::vector<size_t> embedding, head;
  HeldIndex(const std::vector<Held>& params, int64_t n_layers) : by_block(size_t(std::max<int64_t>(n_layers, 0))) {
    for (size_t k = 0; k < params.size(); ++k) {
      const Held& h = params[k];
      if (h.block >= 0) {
        if (h.block < n_layers) by_block[size_t(h.block)].push_back(k);
      } else {
        (h.embedding ? embedding : head).push_back(k);
      }
    }
  }
  // What `part` holds, in catalog order (tp_grads packs gradients in that order).
  std::vector<size_t> of(const Part& part) const {
    std::vector<size_t> out;
    if (part.embedding) out.insert(out.end(), embedding.begin(), embedding.end());
    for (int64_t b : part.blocks)
      if (b >= 0 && b < int64_t(by_block.size())) out.insert(out.end(), by_block[size_t(b)].begin(), by_block[size_t(b)].end());
    if (part.head) out.insert(out.end(), head.begin(), head.end());
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
};

// ZeRO-3's per-unit buffers (parallel/fsdp/sharded_data_parallel.cpp), bytes. pb: bytes of a
// gathered parameter (bf16 gathers under mixed precision), rb: of a reduced gradient; `kept`:
// the parameters of every unit when they stay gathered (fsdp_reshard_after_forward = "never",
// or a pipeline stage holding them for the step), else 0.
struct Zero3Bytes {
  int64_t pb = 4, rb = 4, kept = 0;
  bool keep = false;
  // `policy`: pb, rb and keep of the configuration (the same for all its ranks), kept for `st`.
  Zero3Bytes(const Zero3Bytes& policy, const RankState& st) : Zero3Bytes(policy) {
    kept = keep ? pb * (st.unit_grads_all / 4) : 0;  // every unit's parameters, gathered
  }
  // pb, rb and keep for `cfg` (kept left 0).
  Zero3Bytes(const JobConfig& cfg, int64_t beta) {
    pb = beta == 2 ? 2 : 4;
    rb = cfg.training.mixed_precision_reduce == "bfloat16" ? 2 : 4;
    const std::string& raf = cfg.parallelism.fsdp_reshard_after_forward;
    keep = raf == "never" || (raf == "default" && cfg.parallelism.pipeline_parallel_degree > 1);
  }
  // While unit u's backward computes: its gathered parameters, `grads` bytes of unsharded
  // gradients (GradBytes), the previous unit's prefetched all-gather (`prev`) and the next
  // unit's reduce-scatter not yet retired (`next`; a group of one rank has retired it at once);
  // `own_reduce` adds u's own reduce-scatter input, issued once its backward has returned.
  int64_t backward(const RankState::Unit& u, const RankState::Unit* prev, const RankState::Unit* next,
                   bool own_reduce, int64_t grads) const {
    int64_t b = (keep ? kept : pb * u.full) + grads;
    if (prev && !keep) b += pb * prev->gather;
    if (next) b += rb * (next->gather - next->gather_local);
    if (own_reduce) b += rb * u.gather;
    return b;
  }
};

// The FSDP / ZeRO buffers in the communication category at their peak, bytes (G·S: a unit's
// all-gather output and reduce-scatter input).
// `z`: the rank's ZeRO-3 buffer sizes (used when zero is 3), `rb`: bytes of a reduced gradient.
int64_t fsdp_buffers(const RankState& st, int zero, const JobConfig& cfg, const Zero3Bytes& z, int64_t rb, bool cpu) {
  if (zero == 0 || st.units.empty()) return 0;
  // Pipelined ZeRO-2/3 hold every unit's unsharded gradients between the step's backwards.
  const bool once = cfg.parallelism.pipeline_parallel_degree > 1 && zero >= 2;
  if (zero < 3) {
    int64_t all_in = 0;  // every unit's reduce-scatter input at once
    for (const RankState::Unit& u : st.units) all_in += u.gather;
    // Each unit's reduce-scatter input is issued as its backward ends. Over MPI on the cpu
    // backend they progress only inside other MPI calls, so at the end of backward ZeRO-2 holds
    // them all and ZeRO-1 all but the first issued (measured); NCCL retires them as they go
    // (about two in flight). ZeRO-2 also holds the
    // unsharded gradients of the unit being computed (the first unit, last in backward).
    const int64_t first = st.units.size() > 1 ? st.units.back().gather : 0;  // the first issued (backward order)
    const int64_t in_flight = cpu ? all_in - (zero == 1 ? first : 0) : 2 * st.unit_gather_max;
    const int64_t at_end =
        rb * in_flight + (rb == 2 ? 4 * st.unit_gather_max : 0) + (zero == 2 ? 4 * st.units.front().full : 0);
    return once ? std::max(at_end, st.unit_grads_all) : at_end;
  }
  // ZeRO-3: the largest unit's buffers at the end of its backward, over all the rank's units.
  int64_t peak = 0;
  const size_t n = st.units.size();
  for (size_t i = 0; i < n; ++i)
    peak = std::max(peak, z.backward(st.units[i], i > 0 ? &st.units[i - 1] : nullptr,
                                     i + 1 < n ? &st.units[i + 1] : nullptr, true, 4 * st.units[i].full));
  // Reducing once: between the step's backwards every unit's gradients, no reduce-scatter; in
  // the last micro-batch unit i's reduce-scatter input is copied while its gradients and those
  // of the units before it (forward order) are alive, and the inputs of the units after it not
  // yet retired (over MPI on the cpu backend: none retires before backward ends; NCCL: the
  // next one).
  if (once) {
    peak = std::max(peak, z.backward(st.units.front(), nullptr, nullptr, false, st.unit_grads_all));
    int64_t grads = st.unit_grads_all, issued = 0;
    for (size_t i = n; i-- > 0;) {
      const RankState::Unit& u = st.units[i];
      const int64_t next = i + 1 < n ? z.rb * (st.units[i + 1].gather - st.units[i + 1].gather_local) : 0;
      const int64_t in_flight = cpu ? issued : next;
      peak = std::max(peak, (z.keep ? z.kept : z.pb * u.full) + grads + in_flight + z.rb * u.gather);
      grads -= 4 * u.full;
      issued += z.rb * (u.gather - u.gather_local);
    }
  }
  return peak;
}

// The unit keys of a stage in forward order: −2 the embedding, block indices, n_layers the head.
std::vector<int64_t> unit_keys(const ActivationShape::Stage& stage, int64_t n_layers) {
  std::vector<int64_t> keys;
  if (stage.embedding) keys.push_back(-2);
  keys.insert(keys.end(), stage.blocks.begin(), stage.blocks.end());
  if (stage.head) keys.push_back(n_layers);
  return keys;
}

// The unsharded gradient bytes alive during the backward of the i-th of a stage's units (in
// forward order), and during forward phases (parallel/fsdp/sharded_data_parallel.hpp). Without
// pp each micro-batch reduces its own: during a unit's backward only the unit's. Pipelined
// ZeRO-2/3 reduce once per step (reduce_once_per_step): a unit's gradients are allocated at its
// first backward of the step and stay until its last, so what is alive depends on which of the
// rank's stages have run a backward (SimulationResult::InFlightState::backed): theirs, in every
// phase, and during a stage's first backward its own units after the one computing (in forward
// order: they ran before it) and that unit's.
struct GradBytes {
  std::vector<int64_t> backward;  // per unit of the stage
  int64_t forward = 0;
  // Reducing every micro-batch: a unit's own during its backward.
  void set(const RankState& st, size_t stage) {
    forward = 0;
    backward.clear();
    for (size_t u : st.stage_units.at(stage)) backward.push_back(4 * st.units[u].full);
  }
  // Reducing once per step, with `backed` the rank's stages that have run a backward (every
  // stage when `all`). Refilled in place: the planner asks for every state group of every rank.
  void set(const RankState& st, size_t stage, const std::vector<char>& backed, bool all) {
    forward = 0;
    for (size_t k = 0; k < backed.size() && k < st.stage_units.size(); ++k)
      if (all || backed[k])
        for (size_t u : st.stage_units[k]) forward += 4 * st.units[u].full;
    const std::vector<size_t>& idx = st.stage_units.at(stage);
    backward.assign(idx.size(), forward);
    if (stage < backed.size() && (all || backed[stage])) return;
    int64_t after = 0;  // the stage's units after i, whose backward ran first
    for (size_t i = idx.size(); i-- > 0;) {
      after += 4 * st.units[idx[i]].full;
      backward[i] += after;
    }
  }
};

// The bytes of activations at each unit's phase of one stage (ActivationPrediction, or one of
// its groups).
struct Phases {
  size_t stage = 0;
  const std::vector<int64_t>& fwd;
  const std::vector<int64_t>& bwd;
  const std::vector<int64_t>& after;
};
Phases phases_of(const ActivationPrediction& a) {
  return {a.stage, a.forward_by_unit, a.backward_by_unit, a.after_backward_by_unit};
}
Phases phases_of(const ActivationPrediction::Group& g) {
  return {g.stage, g.forward_by_unit, g.backward_by_unit, g.after_backward_by_unit};
}

// ZeRO-3: max over the stage's units of activations + FSDP buffers during the same unit's
// forward (its parameters and the next unit's prefetch) or backward (Zero3Bytes::backward, while
// it computes and once it has returned). `once`: reducing once per step, reduce-scatters run only
// in the last micro-batch, each input replacing gradients of its unit already counted.
int64_t phase_total(const RankState& st, const Phases& act, const GradBytes& grads, bool once, const Zero3Bytes& z) {
  const std::vector<size_t>& idx = st.stage_units.at(act.stage);
  auto unit = [&](size_t i) -> const RankState::Unit* { return i < idx.size() ? &st.units[idx[i]] : nullptr; };
  int64_t best = 0;
  for (size_t i = 0; i < idx.size() && i < act.fwd.size(); ++i) {
    int64_t comm = (z.keep ? z.kept : z.pb * unit(i)->full) + grads.forward;
    if (i + 1 < idx.size() && !z.keep) comm += z.pb * unit(i + 1)->gather;  // the next unit, prefetched
    best = std::max(best, act.fwd[i] + comm);
  }
  for (size_t i = 0; i < idx.size() && i < act.bwd.size(); ++i) {
    const RankState::Unit* prev = i > 0 ? unit(i - 1) : nullptr;
    const RankState::Unit* next = once ? nullptr : unit(i + 1);
    best = std::max(best, act.bwd[i] + z.backward(*unit(i), prev, next, false, grads.backward[i]));
    best = std::max(best, act.after[i] + z.backward(*unit(i), prev, next, !once, grads.backward[i]));
  }
  return best;
}

// ZeRO-1/2: max over the stage's units of activations + the reduce-scatter inputs issued so far
// (every unit after it in forward order; on NCCL about two in flight) + ZeRO-2's unsharded
// gradients (`grads`).
int64_t phase_total_zero12(const RankState& st, const Phases& act, const GradBytes& grads, bool once, int64_t rb,
                           int zero, bool cpu) {
  const std::vector<size_t>& idx = st.stage_units.at(act.stage);
  auto unit = [&](size_t i) -> const RankState::Unit& { return st.units[idx[i]]; };
  int64_t best = 0, issued = 0;
  if (zero == 2)  // forward phases, with the gradients a pipelined step keeps
    for (size_t i = 0; i < idx.size() && i < act.fwd.size(); ++i) best = std::max(best, act.fwd[i] + grads.forward);
  const size_t n = std::min(idx.size(), act.bwd.size());
  if (once) {  // reducing once: no reduce-scatter before the last micro-batch
    for (size_t i = 0; i < n; ++i)
      best = std::max(best, std::max(act.bwd[i], act.after[i]) + (zero == 2 ? grads.backward[i] : 0));
    return best;
  }
  // Reduce-scatter inputs in issue order (backward runs the units last to first): the first
  // issued and the last two are all the rules below read.
  int64_t first = 0, last = 0, before_last = 0;
  size_t count = 0;
  for (size_t i = n; i-- > 0;) {
    // Over MPI on the cpu backend they progress only inside other MPI calls: ZeRO-2's are all
    // alive at the end of backward, ZeRO-1's (issued together in the last backward) all but the
    // first (measured); NCCL retires them as it goes: the last two.
    int64_t in_flight = zero == 1 && count > 0 ? issued - first : issued;
    if (!cpu) in_flight = (count >= 1 ? last : 0) + (count >= 2 ? before_last : 0);
    const int64_t g = zero == 2 ? grads.backward[i] : 0;
    best = std::max(best, act.bwd[i] + rb * in_flight + g);
    best = std::max(best, act.after[i] + rb * (in_flight + unit(i).gather) + g);
    const int64_t gathered = unit(i).gather;
    issued += gathered;
    if (count == 0) first = gathered;
    before_last = last;
    last = gathered;
    ++count;
  }
  return best;
}


}  // namespace

namespace {
std::vector<RankState> compute_rank_states(const ModelArgs& args, const ParallelDims& d, const PipelinePlan* plan,
                                           bool sequence_parallel);
}

// Memoized: the planner asks for the same model split under many other knobs (AC, ZeRO stage,
// batch, dtypes), and the walk over every parameter dominates a candidate's cost otherwise.
std::shared_ptr<const std::vector<RankState>> rank_states(const ModelArgs& args, const ParallelDims& d, const PipelinePlan* plan,
                                   bool sequence_parallel) {
  static std::mutex mu;
  // Never destroyed, like predict_activations' memo: freeing thousands of splits at exit is slow.
  static auto& memo = *new std::unordered_map<std::vector<int64_t>, std::shared_ptr<const std::vector<RankState>>, IntsHash>;
  // Integers only (the model and schedule names as interned ids): the planner asks once per
  // candidate, and formatting a string key cost more than the prediction it saved.
  std::vector<int64_t> key = {model_id(args), d.tp, d.ep, d.dp_shard * d.cp, d.pp, int64_t(sequence_parallel)};
  if (d.pp > 1 && plan) {
    key.reserve(key.size() + 3 + 2 * plan->stages.size());
    key.push_back(intern(plan->schedule.name));
    key.push_back(plan->microbatches);
    key.push_back(plan->schedule.stages_per_rank);
    for (const StageLayers& s : plan->stages) {
      key.push_back(s.first_layer);
      key.push_back(s.num_layers);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = memo.find(key);
    if (it != memo.end()) return it->second;
  }
  std::vector<RankState> ranks = compute_rank_states(args, d, plan, sequence_parallel);
  static std::atomic<int64_t> next_split{0};
  const int64_t split = ++next_split;
  // The key without the FSDP group names what the activations depend on.
  std::vector<int64_t> shape = key;
  shape.erase(shape.begin() + 3);
  static auto& shapes = *new std::unordered_map<std::vector<int64_t>, int64_t, IntsHash>;  // never destroyed (exit)
  int64_t shape_id = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    shape_id = shapes.try_emplace(std::move(shape), int64_t(shapes.size()) + 1).first->second;
  }
  for (RankState& st : ranks) {
    st.split_id = split;
    st.activation_split_id = shape_id;
  }
  auto made = std::make_shared<const std::vector<RankState>>(std::move(ranks));
  std::lock_guard<std::mutex> lock(mu);
  if (memo.size() > 4096) memo.clear();  // bounded: a plan visits a few hundred splits
  memo.emplace(key, made);
  return made;
}

namespace {
std::vector<RankState> compute_rank_states(const ModelArgs& args, const ParallelDims& d, const PipelinePlan* plan,
                                           bool sequence_parallel) {
  const int64_t fsdp = d.dp_shard * d.cp, efsdp = fsdp / std::max<int64_t>(d.ep, 1);
  const std::vector<Held>& params = held_parameters(args, d.tp, d.ep, sequence_parallel);
  const std::vector<Part> parts = parts_of(args, d.pp > 1 ? plan : nullptr);
  const Flight* flight = d.pp > 1 && plan ? &in_flight(*plan) : nullptr;
  const HeldIndex index(params, args.n_layers);
  std::vector<RankState> out;
  for (size_t r = 0; r < parts.size(); ++r) {
    const Part& part = parts[r];
    RankState st;
    st.blocks = part.blocks;
    st.embedding = part.embedding;
    st.head = part.head;
    st.stages = std::make_shared<const std::vector<ActivationShape::Stage>>(part.stages);
    if (flight) {
      st.in_flight = flight->peak.at(r);
      st.in_flight_states = flight->states.at(r);
      st.states_id = flight->ids.at(r);
    }
    std::map<int64_t, std::array<int64_t, 4>> unit;  // unit key (forward order) -> full, gather, local gather, experts
    int64_t packed_full = 0, packed_shard = 0;  // tp_grads' chunk being filled
    auto pack = [](int64_t& largest, int64_t& chunk, int64_t n) {
      if (n > kTpGradChunkElems) return;
      if (chunk + n > kTpGradChunkElems) chunk = 0;
      chunk += n;
      largest = std::max(largest, chunk);
    };
    auto add = [&](const Held& h, int64_t key) {
      const bool expert = h.expert && d.ep > 1;
      const int64_t g = expert ? efsdp : fsdp;
      const int64_t full = a16(h.rows * h.cols), sh = a16((h.rows + g - 1) / g * h.cols);
      st.flat += full;
      st.shard += sh;
      if (expert) st.shard_experts += sh;
      if (h.matrix) st.flat_muon += full, st.shard_muon += sh;
      if (h.tp_partial) {  // tp_grads' packing: shards past a chunk go in place
        pack(st.tp_partial, packed_full, h.rows * h.cols);
        pack(st.tp_partial_sharded, packed_shard, std::min(h.rows, (h.rows + g - 1) / g) * h.cols);
      }
      auto& u = unit[key];
      u[0] += full;
      u[1] += sh * g;
      if (g == 1) u[2] += sh;
      if (expert) u[3] += 1;
    };
    // The head joins the embedding's unit when it reads the tied weight (shard_plan.cpp).
    const int64_t head_key = args.tie_word_embeddings && part.embedding ? -2 : args.n_layers;
    for (size_t k : index.of(part)) {
      const Held& h = params[k];
      add(h, h.block >= 0 ? h.block : (h.embedding ? -2 : head_key));
    }
    // A tied output projection on a stage without the embedding holds its own copy.
    if (args.tie_word_embeddings && part.head && !part.embedding)
      for (const Held& h : params)
        if (h.embedding) add(h, args.n_layers);
    const double attn = double(args.dim) * double(args.head_dim) * double(2 * args.n_heads + 2 * args.n_kv_heads);
    for (int64_t b : part.blocks)
      for (const MuonMatrix& mx : muon_matrices(args, b)) {
        const double one = newton_schulz_flops(mx.rows, mx.cols, 1);
        st.muon_ns_flops += one * double(mx.count);
        st.muon_ns_largest = std::max(st.muon_ns_largest, one);
        st.muon_matrices += mx.count;
        st.muon_workspace = std::max(st.muon_workspace, newton_schulz_workspace(mx.rows, mx.cols));
      }
    for (int64_t b : part.blocks) {
      st.moe_layers += args.is_moe_layer(b) ? 1 : 0;
      st.block_params.push_back(
          args.is_moe_layer(b) ? attn + double(args.num_experts * args.dim) +
                                     3.0 * double(args.dim) * double(args.moe_inter_dim) *
                                         double(args.top_k + args.num_shared_experts)
                               : attn + 3.0 * double(args.dim) * double(args.ffn_dim()));
    }
    for (const auto& [k, v] : unit) {
      st.unit_full_max = std::max(st.unit_full_max, v[0]);
      st.unit_gather_max = std::max(st.unit_gather_max, v[1]);
      st.unit_of[k] = st.units.size();
      st.units.push_back({v[0], v[1], v[2]});
      if (d.ep > 1 && v[3] == 0) ++st.units_without_experts;
    }
    if (head_key == -2 && st.unit_of.count(-2)) st.unit_of[args.n_layers] = st.unit_of[-2];
    for (const RankState::Unit& u : st.units) st.unit_grads_all += 4 * u.full;
    for (const ActivationShape::Stage& sg : *st.stages) {
      std::vector<size_t> idx;
      for (int64_t k : unit_keys(sg, args.n_layers)) idx.push_back(st.unit_of.at(k));
      st.stage_units.push_back(std::move(idx));
    }
    st.signature = key_of("", {st.in_flight, st.states_id, st.flat,
                               st.shard, st.moe_layers, int64_t(st.embedding), int64_t(st.head)});
    for (const ActivationShape::Stage& sg : *st.stages) {
      st.signature = key_of(st.signature, {int64_t(sg.blocks.size()), int64_t(sg.embedding), int64_t(sg.head)});
      if (args.num_experts > 0)
        for (int64_t b : sg.blocks) st.signature += args.is_moe_layer(b) ? 'm' : 'd';
    }
    st.signature_id = intern(st.signature);
    out.push_back(std::move(st));
  }
  return out;
}
}  // namespace

namespace {

// The activation replays of a configuration's distinct pipeline ranks, in rank order: the ranks
// of the same shape (signature, and where selective recomputation falls in each stage) share
// one, the first of them standing for the rest.
using RankActivations = std::vector<std::pair<size_t, std::shared_ptr<const ActivationPrediction>>>;

// The inputs of predict_activations besides the rank's stages and in-flight states (which the
// rank states fix), as in its memo key: the model's sizes, then micro_batch, seq_len, cp, tp,
// ep, sequence_parallel, act_bytes, recompute_every, pp_microbatches and loss_chunk_tokens.
using ActivationKey = std::array<int64_t, 25>;

// rank_activations() for the last few (rank states, activation inputs) asked. The planner
// predicts the same split and micro-batch under several ZeRO stages, reduce dtypes and cp
// rotations in a row, and the replays' memo key (a vector per rank) cost more than the rest of
// the memory model. The rank states are held, so their address names them while cached.
struct ActivationsCache {
  struct Entry {
    std::shared_ptr<const std::vector<RankState>> states;
    ActivationKey key{};
    RankActivations ranks;
  };
  std::array<Entry, 16> entries;
  size_t next = 0;
};

const RankActivations& rank_activations(const std::shared_ptr<const std::vector<RankState>>& states,
                                        const ModelArgs& g, const ActivationKey& key) {
  thread_local ActivationsCache cache;
  // Per (activation inputs, activation split): the predictions made so far, by rank (one
  // lookup per call: a lookup per rank cost as much as the rest of the memory model).
  using SplitKey = std::array<int64_t, 26>;
  thread_local std::unordered_map<SplitKey, std::vector<std::shared_ptr<const ActivationPrediction>>, IntsHash> by_split;
  for (const ActivationsCache::Entry& e : cache.entries)
    if (e.states == states && e.key == key) return e.ranks;
  RankActivations made;
  ActivationShape as;
  as.args = g;
  as.micro_batch = key[15];
  as.seq_len = key[16];
  as.cp = key[17];
  as.tp = key[18];
  as.ep = key[19];
  as.sequence_parallel = key[20] != 0;
  as.act_bytes = key[21];
  as.recompute_every = key[22];
  as.pp_microbatches = key[23];
  const int64_t every = as.recompute_every;
  // Pipeline ranks of the same shape give the same prediction: (signature, where selective
  // recomputation falls in each stage) of the ranks predicted so far.
  // (Signatures compared as their interned numbers: a pp 64 split compares 2,000 pairs.)
  thread_local size_t kept = 0;  // predictions held in by_split (bounded)
  std::vector<std::shared_ptr<const ActivationPrediction>>* known = nullptr;
  const int64_t split = states->empty() ? 0 : states->front().activation_split_id;  // one per rank_states() result
  if (split > 0) {
    SplitKey sk{};
    std::copy(key.begin(), key.end(), sk.begin());
    sk[25] = split;
    if (kept > 65536 && !by_split.count(sk)) by_split.clear(), kept = 0;
    known = &by_split[sk];
    known->resize(states->size());
  }
  std::vector<std::pair<int64_t, std::vector<int64_t>>> seen;
  for (size_t r = 0; r < states->size(); ++r) {
    const RankState& st = (*states)[r];
    std::vector<int64_t> phase;
    if (every > 1)
      for (const ActivationShape::Stage& sg : *st.stages) phase.push_back(sg.blocks.empty() ? 0 : sg.blocks.front() % every);
    bool repeat = false;
    for (const auto& [sig, ph] : seen) repeat |= sig == st.signature_id && ph == phase;
    if (repeat) continue;
    seen.emplace_back(st.signature_id, std::move(phase));
    // The same rank of a split that differs only in the FSDP group has the same replay.
    if (known && (*known)[r]) {
      made.emplace_back(r, (*known)[r]);
      continue;
    }
    as.stages = st.stages;
    as.in_flight = st.in_flight;
    as.states = st.in_flight_states;
    as.states_id = st.states_id;
    made.emplace_back(r, predict_activations(as));
    if (known) {
      (*known)[r] = made.back().second;
      ++kept;
    }
  }
  ActivationsCache::Entry& e = cache.entries[cache.next];
  cache.next = (cache.next + 1) % cache.entries.size();
  e.states = states;
  e.key = key;
  e.ranks = std::move(made);
  return e.ranks;
}

}  // namespace

MemoryPrediction predict_memory(const JobConfig& cfg, const ParallelDims& d, const PipelinePlan* plan,
                                std::shared_ptr<const std::vector<RankState>>* states_out,
                                std::shared_ptr<const ActivationPrediction>* act_out, const ModelArgs* given,
                                std::shared_ptr<const std::vector<RankState>> known, int64_t stop_above) {
  std::optional<ModelArgs> own;  // the caller's when given (the planner's many candidates share one)
  const ModelArgs& args = given ? *given : own.emplace(cfg.model_args());
  const int64_t fsdp = d.dp_shard * d.cp;
  const bool sharded = fsdp > 1;
  const int zero = sharded ? int(cfg.parallelism.zero_stage) : 0;
  const bool bf16 = cfg.training.mixed_precision_param == "bfloat16";
  const int64_t beta = bf16 ? 2 : 4;
  const CheckpointPolicy ac =
      CheckpointPolicy::from_deck(cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option);
  const int64_t every = ac.mode == CheckpointPolicy::Mode::kFull        ? 1
                        : ac.mode == CheckpointPolicy::Mode::kSelective ? ac.every
                        : ac.mode == CheckpointPolicy::Mode::kOp        ? -1
                                                                        : 0;
  const bool cpu = cfg.training.device == "cpu";
  const bool muon = uses_muon(cfg);

  MemoryPrediction best;
  const std::shared_ptr<const std::vector<RankState>> states =
      known ? std::move(known) : rank_states(args, d, plan, cfg.parallelism.enable_sequence_parallel);
  const int64_t micro_batch = d.pp > 1 && plan ? plan->microbatch_size : cfg.training.local_batch_size;
  const ActivationKey act_key = {args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.head_dim,
                                 args.vocab_size, args.ffn_dim(), args.num_experts, args.top_k, args.moe_inter_dim,
                                 args.num_shared_experts, args.n_dense_layers, args.moe_layer_step,
                                 int64_t(args.qk_norm), int64_t(args.aux_loss_coeff > 0), micro_batch,
                                 cfg.training.seq_len, d.cp, d.tp, d.ep,
                                 int64_t(cfg.parallelism.enable_sequence_parallel), beta, every,
                                 d.pp > 1 && plan ? plan->microbatches : 0, args.loss_chunk_tokens};
  const Zero3Bytes zero3(cfg, beta);  // the ZeRO-3 policy; each rank's kept bytes below
  const int64_t rb = zero3.rb;
  GradBytes grads;  // refilled per rank and state group
  // Each distinct rank's categories (cheap) first; its total (the phase-by-phase sums, costly)
  // after, for the ranks in falling order of their bound, so that one rank's total can rule
  // out the ranks bounded below it.
  struct Pending {
    MemoryPrediction m;
    const RankState* st;
    const ActivationPrediction* act;
    int64_t bound, partial, muon_step, during_backward;
  };
  thread_local std::vector<Pending> pending;
  pending.clear();
  for (const auto& [r, shared] : rank_activations(states, args, act_key)) {
    const RankState& st = (*states)[r];
    MemoryPrediction m;
    const int64_t flat = st.flat, shard = st.shard;
    switch (zero) {
      case 0:
        m.parameters = 4 * flat;
        m.gradients = 4 * flat;
        m.optimizer = 8 * flat;
        break;
      case 1:
        m.parameters = 4 * flat;
        m.gradients = 4 * (flat + shard);
        m.optimizer = 8 * shard;
        break;
      case 2:
        m.parameters = 4 * flat;
        m.gradients = 4 * shard;
        m.optimizer = 8 * shard;
        break;
      default:
        m.parameters = 4 * shard;
        m.gradients = 4 * shard;
        m.optimizer = 8 * shard;
    }
    if (muon) {  // Muon's matrices keep one float32 momentum buffer, not AdamW's two moments
      const int64_t matrices = zero == 0 ? st.flat_muon : st.shard_muon;
      m.optimizer -= 4 * matrices;
    }
    if (bf16 && zero < 3) m.parameters += 2 * flat;  // the flat bf16 compute copy
    if (zero > 0) {  // the experts' instance's empty shard buffers
      m.gradients += st.units_without_experts;
      if (zero == 3) m.parameters += st.units_without_experts;
    }
    m.parameters += st.moe_layers * args.num_experts * 4;  // expert_bias on the device

    const ActivationPrediction& act = *shared;
    m.activations = act.peak;
    if (act_out && act.peak >= best.activations) *act_out = shared;

    // Communication buffers at the step's high-water mark (parallel/fsdp/sharded_data_parallel.cpp).
    const Zero3Bytes z(zero3, st);
    m.communication = fsdp_buffers(st, zero, cfg, z, rb, cpu);
    // tp_grads' packed all-reduce of the gradients partial over tp, after the step's backward.
    const int64_t partial = zero > 0 ? st.tp_partial_sharded : st.tp_partial;
    if (partial > 0) m.communication = std::max(m.communication, 4 * partial);
    // Muon's step: the owner's gathered matrix and Newton–Schulz buffers (the largest matrix;
    // one at a time), after the backwards, beside the state only.
    const int64_t muon_step = muon ? 4 * st.muon_workspace : 0;
    m.communication = std::max(m.communication, muon_step);
    const int64_t tokens = micro_batch * (cfg.training.seq_len / d.cp);
    if (d.cp > 1) {
      const int64_t kv = 2 * tokens * (args.n_kv_heads / d.tp) * args.head_dim;
      m.communication += cfg.parallelism.context_parallel_rotate_method == "allgather" ? d.cp * kv * beta
                                                                                       : 2 * kv * beta + 3 * kv * 4;
    }
    if (d.ep > 1) {
      const int64_t local = cfg.parallelism.enable_sequence_parallel && d.tp > 1 ? tokens / d.tp : tokens;
      m.communication += local * args.top_k * args.dim * beta;  // the rows in flight
    }
    // Without ZeRO the communication category is tp_grads' buffer (after the backwards) plus
    // the cp and ep buffers (during them).
    const int64_t during_backward = zero > 0 ? 0 : m.communication - 4 * partial;
    m.temporaries = cpu ? int64_t(3) * 1024 * 1024 * 4 : 0;
    // Per category the largest rank (what the run's summary reports).
    best.parameters = std::max(best.parameters, m.parameters);
    best.gradients = std::max(best.gradients, m.gradients);
    best.optimizer = std::max(best.optimizer, m.optimizer);
    best.activations = std::max(best.activations, m.activations);
    best.communication = std::max(best.communication, m.communication);
    best.temporaries = std::max(best.temporaries, m.temporaries);
    pending.push_back({m, &st, &act, std::max(m.state() + act.peak + m.communication, m.temporaries), partial,
                       muon_step, during_backward});
  }
  // A rank's total is at most the state plus the activations' and the communication buffers'
  // peaks together: once a total reaches the next rank's bound, no later rank can raise it. Past
  // `stop_above` the caller needs no exact total (the total is then a lower bound).
  std::sort(pending.begin(), pending.end(), [](const Pending& x, const Pending& y) { return x.bound > y.bound; });
  for (Pending& p : pending) {
    if (p.bound <= best.total || best.total > stop_above) break;
    const RankState& st = *p.st;
    const ActivationPrediction& act = *p.act;
    MemoryPrediction& m = p.m;
    const int64_t partial = p.partial, muon_step = p.muon_step, during_backward = p.during_backward;
    const Zero3Bytes z(zero3, st);
    // The total: activations and communication buffers summed phase by phase (each unit's
    // forward and backward), since their peaks fall in different units.
    // Pipelined ZeRO-2/3 (reduce_once_per_step): each group of in-flight states with the
    // gradients of the stages that have run a backward.
    const bool once = d.pp > 1 && zero >= 2 && !act.groups.empty();
    int64_t coincident = act.peak + during_backward;
    if (once) {
      // The simulator runs one round of micro-batches; with gradient accumulation the later
      // rounds run with every stage's gradients already alive.
      const bool rounds = cfg.grad_accum_steps(d) > 1;
      coincident = 0;
      for (const ActivationPrediction::Group& g : act.groups) {
        grads.set(st, g.stage, g.backed, rounds);
        coincident = std::max(coincident, zero == 3 ? phase_total(st, phases_of(g), grads, true, z)
                                                    : phase_total_zero12(st, phases_of(g), grads, true, rb, zero, cpu));
      }
    } else if (zero > 0) {
      grads.set(st, act.stage);
      coincident = zero == 3 ? phase_total(st, phases_of(act), grads, false, z)
                             : phase_total_zero12(st, phases_of(act), grads, false, rb, zero, cpu);
    }
    // tp_grads' packed all-reduce runs once the step's backwards are done.
    if (partial > 0) coincident = std::max(coincident, act.after_step + 4 * partial);
    // The cpu backend's start-up rate measurement comes before the model exists.
    m.total = std::max({m.state() + std::min(coincident, act.peak + m.communication), m.state() + muon_step,
                        m.temporaries});
    best.total = std::max(best.total, m.total);
  }
  if (states_out) *states_out = states;
  return best;
}

std::string describe_memory(const MemoryPrediction& m) {
  auto size = [](int64_t b) {
    char buf[32];
    if (b >= (int64_t(1) << 30))
      std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(int64_t(1) << 30));
    else
      std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
    return std::string(buf);
  };
  std::string s = "parameters ";
  s += size(m.parameters);
  s += ", gradients ";
  s += size(m.gradients);
  s += ", optimizer ";
  s += size(m.optimizer);
  s += ", activations ";
  s += size(m.activations);
  s += ", communication ";
  s += size(m.communication);
  s += ", total ";
  s += size(m.total);
  return s;
}

}  // namespace meshtrain
