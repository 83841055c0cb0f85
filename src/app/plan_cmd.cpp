// `meshtrain plan --deck FILE --gpus N [--hardware NAME|FILE] [--top K] [--fixed KEYS]
// [--document-tokens N] [--write-deck OUT] [--json OUT] [--plot OUT.png] [--section.key=value ...]`: every valid
// configuration of the deck's model and batch on N devices, ranked by predicted tokens/s among
// those that fit, the best of each strategy family, and why the other families do not fit
// (plan/planner.hpp).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/deck_args.hpp"
#include "config/deck_parser.hpp"
#include "data/token_store.hpp"
#include "plan/document_mask.hpp"
#include "plan/planner.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

namespace {

const char* kUsage =
    "usage: meshtrain plan --deck FILE --gpus N [--hardware NAME|FILE] [--topology FILE] [--top K] [--fixed KEY,KEY|all] "
    "[--document-tokens N] [--write-deck OUT.toml] [--json OUT.json] [--plot OUT.png] [--section.key=value ...]";

std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(int64_t(1) << 30));
  return buf;
}

std::string num(double v, const char* f) {
  char buf[48];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

nlohmann::json to_json(const PlanCandidate& c) {
  nlohmann::json comm = nlohmann::json::array();
  for (const CommTime& t : c.time.comm)
    comm.push_back({{"dim", t.dim}, {"tier", t.tier}, {"bytes", t.bytes}, {"seconds", t.seconds}, {"exposed_s", t.exposed_s}});
  nlohmann::json keys;
  for (const auto& [k, v] : c.deck_keys()) keys[k] = v;
  const MemoryPrediction& m = c.memory;
  return {{"family", c.family()},
          {"knobs", c.knobs()},
          {"dp_replicate", c.dims.dp_replicate},
          {"dp_shard", c.dims.dp_shard},
          {"tp", c.dims.tp},
          {"pp", c.dims.pp},
          {"cp", c.dims.cp},
          {"ep", c.dims.ep},
          {"grad_accum", c.grad_accum},
          {"deck_keys", keys},
          {"memory_bytes",
           {{"parameters", m.parameters},
            {"gradients", m.gradients},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"communication", m.communication},
            {"temporaries", m.temporaries},
            {"total", m.total}}},
          {"fits", c.fits},
          {"headroom", c.headroom},
          {"risky", c.risky},
          {"within_error", c.within_error},
          {"matmul_shape_efficiency", c.time.matmul_shape_efficiency},
          {"attention_efficiency", c.time.attention_efficiency},
          {"compute_s", c.time.compute_s},
          {"exposed_comm_s", c.time.exposed_comm_s},
          {"bubble_s", c.time.bubble_s},
          {"muon_s", c.time.muon_s},
          {"step_s", c.time.step_s},
          {"tokens_per_s_per_device", c.time.tokens_per_s_per_device},
          {"mfu", c.time.mfu},
          {"comm", comm}};
}

std::string comm_text(const PlanCandidate& c) {
  std::string s;
  for (const CommTime& t : c.time.comm)
    if (t.exposed_s > 0.0005 * c.time.step_s) {
      if (!s.empty()) s += ' ';
      s += std::string(t.dim) + "@" + t.tier + " " + num(t.exposed_s, "%.3g");
    }
  return s.empty() ? "-" : s;
}

// Marks: "≈" within the error band of the fastest, "!" above the memory-pressure threshold.
void print_row(int rank, const PlanCandidate& c, double band) {
  const std::string mark = std::string(c.within_error ? "≈" : " ") + (c.risky ? "!" : " ");
  const std::string tps = num(c.time.tokens_per_s_per_device, "%.0f") + " ±" +
                          num(band * c.time.tokens_per_s_per_device, "%.0f");
  std::printf("%3d%s %-30s %-46s %10s %8s %8s %14s %6s %8s %8s  %s\n", rank, mark.c_str(), c.family().c_str(),
              c.knobs().c_str(), gib(double(c.memory.total)).c_str(), num(100 * c.headroom, "%.0f%%").c_str(),
              num(c.time.step_s, "%.3g").c_str(),
              tps.c_str(), num(100 * c.time.mfu, "%.1f%%").c_str(),
              num(c.time.compute_s, "%.3g").c_str(), num(c.time.bubble_s, "%.3g").c_str(), comm_text(c).c_str());
}

void print_header() {
  std::printf("%3s   %-30s %-46s %10s %8s %8s %14s %6s %8s %8s  %s\n", "#", "family", "knobs", "memory", "headroom",
              "step s", "tok/s/dev", "MFU", "compute", "bubble", "exposed comm s (dim@tier)");
}

// Under block_causal, the token-weighted mean document length attention follows: --document-tokens
// when given, else the statistics of the deck's token store's train split; 0 when neither is
// there (attention timed as causal). Returns where it came from, for the output.
std::string document_lengths(const JobConfig& deck, const std::string& given, double& tokens) {
  tokens = 0;
  if (!given.empty()) {
    try {
      size_t used = 0;
      tokens = std::stod(given, &used);
      if (used != given.size()) tokens = 0;
    } catch (const std::exception&) {
      tokens = 0;
    }
    if (!(tokens >= 1)) throw ConfigError("--document-tokens takes a number of tokens ≥ 1, got '" + given + "'");
    return "--document-tokens";
  }
  if (deck.model_args().attn_mask_type != "block_causal") return "";
  try {
    const TokenStore store(deck.training.dataset);
    tokens = token_weighted_document_tokens(store.split("train").doc_offsets);
    return "token-weighted mean of " + deck.training.dataset + "'s train split";
  } catch (const std::exception& e) {
    return std::string("[training] dataset unreadable: ") + e.what();
  }
}

// Muon's share of #1's prediction: its state, its step's Newton–Schulz time and traffic.
void print_muon(const PlanCandidate& c) {
  double bytes = 0, exposed = 0;
  for (const CommTime& t : c.time.comm)
    if (std::string(t.dim) == "muon") bytes = t.bytes, exposed = t.exposed_s;
  std::printf("#1 Muon: one float32 momentum per element of the blocks' 2-D matrices (AdamW's two moments for "
              "embeddings, head and norms); Newton–Schulz %.3g s per step on the busiest owner; gather / scatter "
              "%s per rank per step, %.3g s exposed\n",
              c.time.muon_s, gib(bytes).c_str(), exposed);
}

// Writes `text` to `path` through a temporary name, so no half-written file is left.
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) throw std::runtime_error(path + ": cannot write");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": cannot rename " + tmp);
}

// Memory against tokens/s for every fitting configuration, the Pareto front drawn (matplotlib,
// Debian's /usr/bin/python3 or $MESHTRAIN_PYTHON).
void plot(const PlanResult& r, const std::string& png) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& [bytes, tps] : r.points) pts.push_back({bytes / double(int64_t(1) << 30), tps});
  const std::string data = png + ".points.json";
  write_file(data, pts.dump());
  const char* py = std::getenv("MESHTRAIN_PYTHON");
  const std::string script =
      "import json,sys\n"
      "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
      "pts=json.load(open(sys.argv[1]))\n"
      "xs=[p[0] for p in pts]; ys=[p[1] for p in pts]\n"
      "front=[]; best=-1\n"
      "for x,y in sorted(pts):\n"
      "    if y>best: front.append((x,y)); best=y\n"
      "fig,ax=plt.subplots(figsize=(7,4.5))\n"
      "ax.scatter(xs,ys,s=6,alpha=0.35,label='configurations that fit')\n"
      "ax.plot([p[0] for p in front],[p[1] for p in front],'r.-',label='Pareto front')\n"
      "ax.set_xlabel('predicted peak memory per device (GiB)'); ax.set_ylabel('predicted tokens/s per device')\n"
      "ax.set_title(sys.argv[3]); ax.legend(); fig.tight_layout(); fig.savefig(sys.argv[2]+'.tmp.png',dpi=120)\n"
      "import os; os.replace(sys.argv[2]+'.tmp.png', sys.argv[2])\n";
  const std::string script_path = png + ".plot.py";
  write_file(script_path, script);
  const std::string cmd = std::string(py ? py : "/usr/bin/python3") + " '" + script_path + "' '" + data + "' '" + png +
                          "' 'meshtrain plan: " + std::to_string(r.points.size()) + " configurations that fit'";
  const int rc = std::system(cmd.c_str());
  std::remove(script_path.c_str());
  std::remove(data.c_str());
  if (rc != 0)
    throw std::runtime_error("--plot " + png + ": python3 with matplotlib failed (set MESHTRAIN_PYTHON to an "
                             "interpreter that has it)");
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  const DeckArgs args =
      parse_deck_args(argc, argv, {"--gpus", "--hardware", "--topology", "--top", "--fixed", "--document-tokens",
                                   "--write-deck", "--json", "--plot"});
  auto value = [&](const char* k, const std::string& dflt) {
    return args.values.count(k) ? args.values.at(k) : dflt;
  };
  if (args.deck.empty() || !args.values.count("--gpus")) throw ConfigError(kUsage);
  int64_t gpus = 0, top = 0;
  try {
    gpus = std::stoll(value("--gpus", "0"));
    top = std::stoll(value("--top", "10"));
  } catch (const std::exception&) {
    throw ConfigError(std::string("--gpus and --top take positive integers (") + kUsage + ")");
  }
  if (gpus < 1 || top < 1) throw ConfigError(std::string("--gpus and --top take positive integers (") + kUsage + ")");
  const JobConfig deck = load_job_config(args.deck, args.overrides);
  PlanOptions opts;
  opts.devices = gpus;
  opts.top = top;
  opts.topology_file = value("--topology", "");
  opts.hardware = find_hardware(value("--hardware", deck.training.device == "cpu" ? "cpu" : "h100_sxm"));
  std::stringstream fixed(value("--fixed", ""));
  for (std::string k; std::getline(fixed, k, ',');)
    if (!k.empty()) opts.fixed.insert(k);
  const bool doc_mask = deck.model_args().attn_mask_type == "block_causal";
  const std::string doc_source = document_lengths(deck, value("--document-tokens", ""), opts.document_tokens);
  const PlanResult r = run_plan(deck, opts);
  // Nothing valid: the deck's own layout says why, with validate()'s one line (exit 2).
  if (r.valid == 0) {
    deck.validate(gpus);
    throw ConfigError(args.deck + ": no valid configuration on " + std::to_string(gpus) + " devices (" +
                      std::to_string(r.enumerated) + " enumerated)");
  }
  const ModelArgs a = deck.model_args();
  const HardwareSpec& hw = opts.hardware;

  std::printf("meshtrain plan: %s (%s %s, seq_len %lld, global batch %lld) on %lld × %s (%s usable: %.0f GB less a %.0f%% "
              "fragmentation margin)\n",
              args.deck.c_str(), a.name.c_str(), a.flavor.c_str(), (long long)deck.training.seq_len,
              (long long)deck.training.global_batch_size, (long long)gpus, hw.name.c_str(), gib(r.memory_limit).c_str(),
              hw.memory_bytes / 1e9, 100 * hw.fragmentation);
  std::printf("%lld configurations enumerated in %.2f s: %lld valid, %lld fit\n", (long long)r.enumerated, r.seconds,
              (long long)r.valid, (long long)r.fitting);
  if (doc_mask && opts.document_tokens > 0)
    std::printf("attention: block_causal over documents of %.0f tokens (%s): %.1f%% of causal attention's FLOPs at "
                "seq_len %lld; the time follows the mask, MFU counts attention as causal\n",
                opts.document_tokens, doc_source.c_str(),
                100 * document_attention_share(opts.document_tokens, double(deck.training.seq_len)),
                (long long)deck.training.seq_len);
  else if (doc_mask)
    std::printf("attention: block_causal with no document lengths (%s): timed as causal; --document-tokens N sets "
                "the token-weighted mean document length\n",
                doc_source.c_str());
  if (!r.ranked.empty()) {
    const double band = r.error_band, pct = 100 * (1 - opts.pressure);
    std::printf("\nrecommended %lld that fit (≈: within the model's ±%.0f%% error of the fastest, ordered by "
                "simplicity: fewer model-parallel, then data-parallel dimensions, fewer bytes across racks, more "
                "headroom; !: under %.0f%% headroom, ranked after the others within error):\n",
                (long long)std::min<int64_t>(top, int64_t(r.ranked.size())), 100 * band, pct);
    print_header();
    for (int64_t i = 0; i < top && i < int64_t(r.ranked.size()); ++i) print_row(int(i + 1), r.ranked[size_t(i)], band);
    if (!r.fastest.empty() && r.fastest.front().time.tokens_per_s_per_device >
                                  r.ranked.front().time.tokens_per_s_per_device) {
      std::printf("\nfastest by predicted speed alone:\n");
      print_header();
      print_row(1, r.fastest.front(), band);
    }
    std::printf("\nbest of each strategy family:\n");
    print_header();
    for (size_t i = 0; i < r.best_per_family.size(); ++i) print_row(int(i + 1), r.best_per_family[i], band);
    const PlanCandidate& w = r.ranked.front();
    std::printf("\n#1 memory per device: %s\n", describe_memory(w.memory).c_str());
    if (deck.optimizer.name == "Muon") print_muon(w);
  } else {
    std::printf("\nno configuration fits in %s\n", gib(r.memory_limit).c_str());
  }
  if (!r.rejected.empty()) {
    std::printf("\nfamilies that do not fit:\n");
    for (const auto& [c, why] : r.rejected) std::printf("  %s: %s\n", c.family().c_str(), why.c_str());
  }
  if (!r.invalid_reasons.empty()) {
    std::printf("\nrefused by validate() (the rule train applies), configurations per rule:\n");
    for (const auto& [why, count] : r.invalid_reasons) std::printf("  %8lld  %s\n", (long long)count, why.c_str());
  }
  if (args.values.count("--json")) {
    nlohmann::json j = {{"deck", args.deck},
                        {"devices", gpus},
                        {"hardware", hw.name},
                        {"memory_limit_bytes", r.memory_limit},
                        {"enumerated", r.enumerated},
                        {"valid", r.valid},
                        {"fitting", r.fitting},
                        {"seconds", r.seconds},
                        {"error_band", r.error_band},
                        {"pressure", opts.pressure},
                        {"document_tokens", opts.document_tokens}};
    j["top"] = nlohmann::json::array();
    for (int64_t i = 0; i < top && i < int64_t(r.ranked.size()); ++i) j["top"].push_back(to_json(r.ranked[size_t(i)]));
    j["fastest"] = nlohmann::json::array();
    for (const PlanCandidate& c : r.fastest) j["fastest"].push_back(to_json(c));
    j["best_per_family"] = nlohmann::json::array();
    for (const PlanCandidate& c : r.best_per_family) j["best_per_family"].push_back(to_json(c));
    j["rejected"] = nlohmann::json::array();
    for (const auto& [c, why] : r.rejected) j["rejected"].push_back({{"family", c.family()}, {"why", why}, {"least", to_json(c)}});
    j["invalid_reasons"] = r.invalid_reasons;
    write_file(args.values.at("--json"), j.dump(1) + "\n");
  }
  if (args.values.count("--write-deck")) {
    if (r.ranked.empty()) throw ConfigError("--write-deck: no configuration fits, nothing to write");
    const JobConfig best = apply_candidate(deck, r.ranked.front());
    write_file(args.values.at("--write-deck"),
               "# written by meshtrain plan --gpus " + std::to_string(gpus) + " --hardware " + hw.name + ": " +
                   r.ranked.front().family() + ", " + r.ranked.front().knobs() + "\n" + resolved_deck_toml(best));
    std::printf("\nwrote the fastest configuration to %s\n", args.values.at("--write-deck").c_str());
  }
  if (args.values.count("--plot")) {
    plot(r, args.values.at("--plot"));
    std::printf("plotted memory against tokens/s to %s\n", args.values.at("--plot").c_str());
  }
  return kExitOk;
}

}  // namespace meshtrain::app
