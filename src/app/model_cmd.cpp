// `meshtrain model list` and `meshtrain model info (--name N --flavor F | --deck FILE) [--seq-len T] [--json]`.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "config/deck_parser.hpp"
#include "config/model_args.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

int cmd_model(int argc, char** argv) {
  const std::string sub = argc > 0 ? argv[0] : "";
  if (sub == "list") {
    for (const auto& n : model_names()) {
      std::printf("%s:", n.c_str());
      for (const auto& f : model_flavors(n)) std::printf(" %s", f.c_str());
      std::printf("\n");
    }
    return kExitOk;
  }
  if (sub != "info") throw ConfigError("usage: meshtrain model list | meshtrain model info (--name N --flavor F | --deck FILE) [--seq-len T] [--json]");
  std::string name = "llama3", flavor, deck;
  int64_t seq_len = -1;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--name" && i + 1 < argc) name = argv[++i];
    else if (a == "--flavor" && i + 1 < argc) flavor = argv[++i];
    else if (a == "--deck" && i + 1 < argc) deck = argv[++i];
    else if (a == "--seq-len" && i + 1 < argc) seq_len = std::atoll(argv[++i]);
    else if (a == "--json") json = true;
    else throw ConfigError("meshtrain model info: unknown argument '" + a + "'");
  }
  ModelArgs m;
  if (!deck.empty()) {
    const JobConfig cfg = load_job_config(deck, {});
    m = cfg.model_args();
    if (seq_len < 0) seq_len = cfg.training.seq_len;
  } else {
    try {
      m = model_flavor(name, flavor);
    } catch (const std::out_of_range& e) {
      throw ConfigError("meshtrain model info: " + std::string(e.what()) + " (see meshtrain model list)");
    }
  }
  if (seq_len < 0) seq_len = 8192;
  if (json) {
    nlohmann::json j = {{"name", m.name}, {"flavor", m.flavor}, {"dim", m.dim}, {"n_layers", m.n_layers},
                        {"n_heads", m.n_heads}, {"n_kv_heads", m.n_kv_heads}, {"head_dim", m.head_dim},
                        {"vocab_size", m.vocab_size}, {"ffn_dim", m.ffn_dim()}, {"qk_norm", m.qk_norm},
                        {"tie_word_embeddings", m.tie_word_embeddings}, {"parameters", m.num_params()},
                        {"embedding_parameters", m.num_embedding_params()}, {"seq_len", seq_len},
                        {"flops_per_token", m.flops_per_token(seq_len)}};
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("%s %s: dim %lld, n_layers %lld, n_heads %lld, n_kv_heads %lld, head_dim %lld, ffn_dim %lld, vocab %lld%s%s\n",
              m.name.c_str(), m.flavor.c_str(), (long long)m.dim, (long long)m.n_layers, (long long)m.n_heads,
              (long long)m.n_kv_heads, (long long)m.head_dim, (long long)m.ffn_dim(), (long long)m.vocab_size,
              m.qk_norm ? ", qk_norm" : "", m.tie_word_embeddings ? ", tied embeddings" : "");
  std::printf("  parameters %lld (%.3f B), embedding %lld\n", (long long)m.num_params(), m.num_params() / 1e9,
              (long long)m.num_embedding_params());
  std::printf("  training FLOPs per token at seq_len %lld: %.4g (6·(N − N_emb) + 12·L·H·Dh·T)\n", (long long)seq_len,
              m.flops_per_token(seq_len));
  return kExitOk;
}

}  // namespace meshtrain::app
