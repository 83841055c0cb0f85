// `meshtrain deck reference [--markdown]`, `meshtrain deck torchtitan [--markdown]` and
// `meshtrain deck check --deck FILE --world-size N [--section.key=value ...]`: the registry and
// its TorchTitan compatibility table as documentation, and validate() without a launch.
#include <cstdio>
#include <string>

#include "app/commands.hpp"
#include "app/deck_args.hpp"
#include "config/deck_parser.hpp"
#include "config/deck_reference.hpp"
#include "config/torchtitan_compat.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

namespace {

const char* kUsage =
    "usage: meshtrain deck reference [--markdown] | meshtrain deck torchtitan [--markdown] | meshtrain deck check "
    "--deck FILE --world-size N [--section.key=value ...]";

long long ll(int64_t v) { return static_cast<long long>(v); }

// 8030261248 -> "8.03 B" (and M, k): parameter counts as people quote them.
std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f B", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.2f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

int check(int argc, char** argv) {
  const DeckArgs args = parse_deck_args(argc, argv);
  if (args.deck.empty() || args.world_size < 1) throw ConfigError(kUsage);
  const JobConfig cfg = load_job_config(args.deck, args.overrides);
  const ParallelDims d = cfg.validate(args.world_size);
  const ModelArgs a = cfg.model_args();
  const int64_t global = cfg.global_batch(d), seq = cfg.training.seq_len;
  for (const std::string& n : cfg.notices) std::printf("notice: %s\n", n.c_str());
  if (cfg.job.print_config) std::fputs(resolved_deck_toml(cfg).c_str(), stdout);
  std::printf("%s: valid for %lld rank%s\n", args.deck.c_str(), ll(args.world_size), args.world_size == 1 ? "" : "s");
  std::printf("  degrees: pp %lld × dp_replicate %lld × dp_shard %lld × cp %lld × tp %lld = %lld (ep %lld)\n",
              ll(d.pp), ll(d.dp_replicate), ll(d.dp_shard), ll(d.cp), ll(d.tp), ll(d.world()), ll(d.ep));
  std::printf("  batch: global %lld samples = local %lld × dp %lld × gradient accumulation %lld; %lld tokens per step "
              "(seq_len %lld)\n",
              ll(global), ll(cfg.training.local_batch_size), ll(d.dp()), ll(cfg.grad_accum_steps(d)), ll(global * seq),
              ll(seq));
  std::printf("  model: %s %s: dim %lld, %lld layers, %lld heads (%lld kv, head_dim %lld), ffn %lld, vocab %lld\n",
              a.name.c_str(), a.flavor.c_str(), ll(a.dim), ll(a.n_layers), ll(a.n_heads), ll(a.n_kv_heads),
              ll(a.head_dim), ll(a.ffn_dim()), ll(a.vocab_size));
  if (a.num_experts > 0)
    std::printf("  experts: %lld of %lld blocks MoE, top_k %lld of %lld experts (width %lld), %lld shared; ep %lld\n",
                ll(a.num_moe_layers()), ll(a.n_layers), ll(a.top_k), ll(a.num_experts), ll(a.moe_inter_dim),
                ll(a.num_shared_experts), ll(d.ep));
  std::printf("  parameters: %lld (%s; embedding %lld%s); %.4g training FLOPs per token\n", ll(a.num_params()),
              human(double(a.num_params())).c_str(), ll(a.num_embedding_params()),
              a.num_experts > 0 ? ("; active " + human(double(a.active_params()))).c_str() : "",
              a.flops_per_token(seq));
  std::printf("  steps: %lld, %lld tokens in all; output in %s\n", ll(cfg.training.steps),
              ll(cfg.training.steps * global * seq), cfg.dump_folder().c_str());
  return kExitOk;
}

}  // namespace

int cmd_deck(int argc, char** argv) {
  const std::string sub = argc > 0 ? argv[0] : "";
  if (sub == "--help" || sub == "-h") {
    std::printf("%s\n", kUsage);
    return kExitOk;
  }
  if (sub == "reference" || sub == "torchtitan") {
    const std::string flag = argc > 1 ? argv[1] : "";
    if (argc > 2 || (argc == 2 && flag != "--markdown")) throw ConfigError(kUsage);
    const bool md = flag == "--markdown";
    const std::string text = sub == "reference" ? (md ? deck_reference_markdown() : deck_reference_text())
                                                : (md ? torchtitan_compat_markdown() : torchtitan_compat_text());
    std::fputs(text.c_str(), stdout);
    return kExitOk;
  }
  if (sub == "check") return check(argc - 1, argv + 1);
  throw ConfigError(kUsage);
}

}  // namespace meshtrain::app
