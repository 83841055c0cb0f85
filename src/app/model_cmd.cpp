// `meshtrain model list` and `meshtrain model info (--name N --flavor F | --deck FILE) [--seq-len T] [--json]`:
// the shape, parameter count and training FLOPs per token of any flavor, without building it.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "config/deck_parser.hpp"
#include "config/model_args.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

namespace {

const char* kUsage =
    "usage: meshtrain model list | meshtrain model info (--name NAME --flavor FLAVOR | --deck FILE) [--seq-len T] "
    "[--json]";

long long ll(int64_t v) { return static_cast<long long>(v); }

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f B", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

int list() {
  std::printf("%-8s %-15s %12s %12s %6s %7s %6s %4s %8s %8s %9s\n", "name", "flavor", "parameters", "active", "dim",
              "layers", "heads", "kv", "ffn", "vocab", "experts");
  for (const auto& n : model_names())
    for (const auto& f : model_flavors(n)) {
      const ModelArgs m = model_flavor(n, f);
      const std::string experts =
          m.num_experts > 0 ? std::to_string(m.top_k) + "/" + std::to_string(m.num_experts) : std::string("-");
      std::printf("%-8s %-15s %12s %12s %6lld %7lld %6lld %4lld %8lld %8lld %9s\n", n.c_str(), f.c_str(),
                  human(double(m.num_params())).c_str(), human(double(m.active_params())).c_str(), ll(m.dim),
                  ll(m.n_layers), ll(m.n_heads), ll(m.n_kv_heads), ll(m.num_experts > 0 ? m.moe_inter_dim : m.ffn_dim()),
                  ll(m.vocab_size), experts.c_str());
    }
  return kExitOk;
}

void print_json(const ModelArgs& m, int64_t seq_len) {
  const nlohmann::json j = {
      {"name", m.name}, {"flavor", m.flavor}, {"dim", m.dim}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads},
      {"n_kv_heads", m.n_kv_heads}, {"head_dim", m.head_dim}, {"vocab_size", m.vocab_size},
      {"multiple_of", m.multiple_of}, {"ffn_dim_multiplier", m.ffn_dim_multiplier},
      {"ffn_hidden_dim", m.ffn_hidden_dim}, {"ffn_dim", m.ffn_dim()}, {"norm_eps", m.norm_eps},
      {"rope_theta", m.rope_theta}, {"use_rope_scaling", m.use_rope_scaling},
      {"rope_scaling_factor", m.rope_scaling_factor}, {"rope_low_freq_factor", m.rope_low_freq_factor},
      {"rope_high_freq_factor", m.rope_high_freq_factor}, {"rope_original_max_seq_len", m.rope_original_max_seq_len},
      {"qk_norm", m.qk_norm}, {"tie_word_embeddings", m.tie_word_embeddings},
      {"attn_type", m.attn_type}, {"attn_mask_type", m.attn_mask_type}, {"parameters", m.num_params()},
      {"embedding_parameters", m.num_embedding_params()}, {"matmul_parameters", m.matmul_params()},
      {"seq_len", seq_len}, {"flops_per_token", m.flops_per_token(seq_len)},
      {"flops_per_token_without_tied_output", m.flops_per_token_without_tied_output(seq_len)},
      {"active_parameters", m.active_params()}, {"active_matmul_parameters", m.active_matmul_params()},
      {"num_experts", m.num_experts}, {"top_k", m.top_k}, {"num_shared_experts", m.num_shared_experts},
      {"moe_inter_dim", m.moe_inter_dim}, {"score_func", m.score_func}, {"route_norm", m.route_norm},
      {"route_scale", m.route_scale}, {"load_balance_coeff", m.load_balance_coeff},
      {"aux_loss_coeff", m.aux_loss_coeff}, {"z_loss_coeff", m.z_loss_coeff}, {"n_dense_layers", m.n_dense_layers},
      {"moe_layer_step", m.moe_layer_step}, {"moe_layers", m.num_moe_layers()}};
  std::printf("%s\n", j.dump().c_str());
}

void print_text(const ModelArgs& m, int64_t seq_len) {
  std::printf("%s %s\n", m.name.c_str(), m.flavor.c_str());
  std::printf("  dim %lld, n_layers %lld, n_heads %lld, n_kv_heads %lld, head_dim %lld\n", ll(m.dim), ll(m.n_layers),
              ll(m.n_heads), ll(m.n_kv_heads), ll(m.head_dim));
  if (m.ffn_hidden_dim > 0)
    std::printf("  ffn_dim %lld (ffn_hidden_dim)\n", ll(m.ffn_dim()));
  else
    std::printf("  ffn_dim %lld (2·4·dim/3 × ffn_dim_multiplier %g, rounded up to multiple_of %lld)\n", ll(m.ffn_dim()),
                m.ffn_dim_multiplier > 0 ? m.ffn_dim_multiplier : 1.0, ll(m.multiple_of));
  std::printf("  vocab_size %lld, tie_word_embeddings %s, qk_norm %s, norm_eps %g\n", ll(m.vocab_size),
              m.tie_word_embeddings ? "true" : "false", m.qk_norm ? "true" : "false", m.norm_eps);
  if (m.use_rope_scaling)
    std::printf("  rope_theta %g, RoPE scaling: factor %g, low_freq_factor %g, high_freq_factor %g, original context %lld\n",
                m.rope_theta, m.rope_scaling_factor, m.rope_low_freq_factor, m.rope_high_freq_factor,
                ll(m.rope_original_max_seq_len));
  else
    std::printf("  rope_theta %g, no RoPE scaling\n", m.rope_theta);
  if (m.num_experts > 0) {
    std::printf("  Mixture of Experts: %lld of %lld blocks (n_dense_layers %lld, moe_layer_step %lld); %lld routed experts "
                "of width %lld, top_k %lld, %lld shared\n",
                ll(m.num_moe_layers()), ll(m.n_layers), ll(m.n_dense_layers), ll(m.moe_layer_step), ll(m.num_experts),
                ll(m.moe_inter_dim), ll(m.top_k), ll(m.num_shared_experts));
    std::printf("  router: %s scores, route_norm %s, route_scale %g; load_balance_coeff %g, aux_loss_coeff %g, "
                "z_loss_coeff %g\n",
                m.score_func.c_str(), m.route_norm ? "true" : "false", m.route_scale, m.load_balance_coeff,
                m.aux_loss_coeff, m.z_loss_coeff);
  }
  std::printf("  parameters %lld (%s), embedding %lld, non-embedding %lld\n", ll(m.num_params()),
              human(double(m.num_params())).c_str(), ll(m.num_embedding_params()),
              ll(m.num_params() - m.num_embedding_params()));
  if (m.num_experts > 0)
    std::printf("  active parameters %lld (%s): what one token runs through (top_k of the routed experts)\n",
                ll(m.active_params()), human(double(m.active_params())).c_str());
  std::printf("  matmul parameters N_matmul %lld (%s): all but the embedding lookup%s\n", ll(m.matmul_params()),
              human(double(m.matmul_params())).c_str(),
              m.tie_word_embeddings ? ", the tied output projection counted (it is a matmul)" : "");
  if (m.num_experts > 0)
    std::printf("  active matmul parameters %lld (%s)\n", ll(m.active_matmul_params()),
                human(double(m.active_matmul_params())).c_str());
  if (m.attn_mask_type != "causal" || m.attn_type != "sdpa")
    std::printf("  attention: attn_mask_type %s, attn_type %s%s\n", m.attn_mask_type.c_str(), m.attn_type.c_str(),
                m.attn_mask_type == "block_causal" ? " (each token attends to its own document only)" : "");
  std::printf("  training FLOPs per token at seq_len %lld: %.4g (6·N_matmul + 12·L·H·Dh·T%s, no causal discount%s; "
              "MFU uses it)\n",
              ll(seq_len), m.flops_per_token(seq_len), m.num_experts > 0 ? " with the active N_matmul" : "",
              m.attn_mask_type == "block_causal" ? " nor document-mask discount, as TorchTitan" : "");
  if (m.tie_word_embeddings)
    std::printf("  without the tied output projection: %.4g (6·(N − N_emb) + 12·L·H·Dh·T, TorchTitan's count for tied "
                "models; %.1f%% lower)\n",
                m.flops_per_token_without_tied_output(seq_len),
                100.0 * (1.0 - m.flops_per_token_without_tied_output(seq_len) / m.flops_per_token(seq_len)));
}

}  // namespace

int cmd_model(int argc, char** argv) {
  const std::string sub = argc > 0 ? argv[0] : "";
  if (sub == "--help" || sub == "-h") {
    std::printf("%s\n", kUsage);
    return kExitOk;
  }
  if (sub == "list" && argc == 1) return list();
  if (sub != "info") throw ConfigError(kUsage);
  std::string name = "llama3", flavor, deck;
  int64_t seq_len = -1;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], value;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) value = a.substr(eq + 1), a = a.substr(0, eq);
    const bool valued = a == "--name" || a == "--flavor" || a == "--deck" || a == "--seq-len";
    if (valued && eq == std::string::npos) {
      if (i + 1 >= argc) throw ConfigError("meshtrain model info: " + a + " needs a value");
      value = argv[++i];
    }
    if (a == "--name") name = value;
    else if (a == "--flavor") flavor = value;
    else if (a == "--deck") deck = value;
    else if (a == "--seq-len") {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), seq_len);
      if (ec != std::errc() || p != value.data() + value.size() || seq_len < 1)
        throw ConfigError("meshtrain model info: --seq-len: expected a positive integer, got " + value);
    } else if (a == "--json" && eq == std::string::npos) json = true;
    else throw ConfigError("meshtrain model info: unknown argument '" + std::string(argv[i]) + "' (" + kUsage + ")");
  }
  ModelArgs m;
  if (!deck.empty()) {
    const JobConfig cfg = load_job_config(deck, {});
    m = cfg.model_args();
    if (seq_len < 0) seq_len = cfg.training.seq_len;
  } else {
    const auto names = model_names();
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw ConfigError("meshtrain model info: unknown model '" + name + "' (models: " + join(names) + ")");
    if (flavor.empty()) throw ConfigError("meshtrain model info: --flavor needed (" + name + ": " + join(model_flavors(name)) + ")");
    // Resolved as a deck's [model] name / flavor would be, so TorchTitan's attention flavors
    // (8B_flex, debugmodel_varlen_attn, ...: a shape of the table with block_causal) work here too.
    JobConfig cfg;
    cfg.model.name = name;
    cfg.model.flavor = flavor;
    try {
      m = cfg.model_args();
    } catch (const ConfigError&) {
      throw ConfigError("meshtrain model info: unknown flavor '" + flavor + "' of " + name + " (flavors: " +
                        join(model_flavors(name)) +
                        (name == "llama3" ? "; TorchTitan's debugmodel_flex_attn, debugmodel_varlen_attn, 8B_flex, "
                                            "8B_varlen"
                                          : "") +
                        ")");
    }
  }
  if (seq_len < 0) seq_len = 8192;  // the published models' training context
  if (json) print_json(m, seq_len);
  else print_text(m, seq_len);
  return kExitOk;
}

}  // namespace meshtrain::app
