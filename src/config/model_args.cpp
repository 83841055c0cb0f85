#include "config/model_args.hpp"

#include <utility>
#include <stdexcept>

namespace meshtrain {

int64_t ModelArgs::ffn_dim() const {
  if (ffn_hidden_dim > 0) return ffn_hidden_dim;
  int64_t hidden = 4 * dim;
  hidden = (2 * hidden) / 3;
  if (ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

int64_t ModelArgs::num_embedding_params() const { return vocab_size * dim; }

bool ModelArgs::is_moe_layer(int64_t layer) const {
  return num_experts > 0 && layer >= n_dense_layers && moe_layer_step > 0 &&
         layer % moe_layer_step == moe_layer_step - 1;
}

int64_t ModelArgs::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < n_layers; ++i) n += is_moe_layer(i);
  return n;
}

int64_t ModelArgs::moe_ffn_params() const {
  return num_experts * dim + (num_experts + num_shared_experts) * 3 * dim * moe_inter_dim;
}

int64_t ModelArgs::moe_ffn_active_params() const {
  return num_experts * dim + (top_k + num_shared_experts) * 3 * dim * moe_inter_dim;
}

namespace {
// Parameters of the model with each MoE feed-forward counted as `moe_ffn`.
int64_t params_with(const ModelArgs& a, int64_t moe_ffn) {
  const int64_t q = a.dim * a.n_heads * a.head_dim, kv = 2 * a.dim * a.n_kv_heads * a.head_dim;
  const int64_t o = a.n_heads * a.head_dim * a.dim;
  const int64_t norms = 2 * a.dim + (a.qk_norm ? 2 * a.head_dim : 0);
  const int64_t moe_layers = a.num_moe_layers();
  const int64_t layers = a.n_layers * (q + kv + o + norms) + (a.n_layers - moe_layers) * 3 * a.dim * a.ffn_dim() +
                         moe_layers * moe_ffn;
  const int64_t output = a.tie_word_embeddings ? 0 : a.vocab_size * a.dim;
  return a.num_embedding_params() + layers + a.dim + output;
}
}  // namespace

int64_t ModelArgs::num_params() const { return params_with(*this, moe_ffn_params()); }

int64_t ModelArgs::active_params() const { return params_with(*this, moe_ffn_active_params()); }

int64_t ModelArgs::matmul_params() const {
  return num_params() - num_embedding_params() + (tie_word_embeddings ? vocab_size * dim : 0);
}

int64_t ModelArgs::active_matmul_params() const {
  return active_params() - num_embedding_params() + (tie_word_embeddings ? vocab_size * dim : 0);
}

double ModelArgs::flops_per_token(int64_t seq_len) const {
  return 6.0 * static_cast<double>(active_matmul_params()) +
         12.0 * static_cast<double>(n_layers * n_heads * head_dim) * static_cast<double>(seq_len);
}

double ModelArgs::flops_per_token_without_tied_output(int64_t seq_len) const {
  return 6.0 * static_cast<double>(active_params() - num_embedding_params()) +
         12.0 * static_cast<double>(n_layers * n_heads * head_dim) * static_cast<double>(seq_len);
}

namespace {

ModelArgs llama3(const char* flavor, int64_t dim, int64_t layers, int64_t heads, int64_t kv, double mult,
                 int64_t multiple_of, int64_t vocab, bool tie, bool scaling, double factor) {
  ModelArgs a;
  a.name = "llama3";
  a.flavor = flavor;
  a.dim = dim;
  a.n_layers = layers;
  a.n_heads = heads;
  a.n_kv_heads = kv;
  a.head_dim = dim / heads;
  a.ffn_dim_multiplier = mult;
  a.multiple_of = multiple_of;
  a.vocab_size = vocab;
  a.tie_word_embeddings = tie;
  a.use_rope_scaling = scaling;
  a.rope_scaling_factor = factor;
  return a;
}

ModelArgs qwen3(const char* flavor, int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t head_dim,
                int64_t hidden, int64_t vocab, bool tie) {
  ModelArgs a;
  a.name = "qwen3";
  a.flavor = flavor;
  a.dim = dim;
  a.n_layers = layers;
  a.n_heads = heads;
  a.n_kv_heads = kv;
  a.head_dim = head_dim;
  a.ffn_hidden_dim = hidden;
  a.vocab_size = vocab;
  a.tie_word_embeddings = tie;
  a.qk_norm = true;
  a.rope_theta = 1000000.0;
  a.norm_eps = 1e-6;
  return a;
}

// A Qwen3-MoE flavor (Qwen's Qwen3-30B-A3B / 235B-A22B config.json; TorchTitan's qwen3
// debugmodel_moe): every block MoE, softmax top-k with renormalized gates, no shared expert.
ModelArgs qwen3_moe(const char* flavor, int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t hidden,
                    int64_t experts, int64_t top_k, int64_t moe_hidden, int64_t vocab, double theta) {
  ModelArgs a = qwen3(flavor, dim, layers, heads, kv, 128, hidden, vocab, false);
  a.rope_theta = theta;
  a.num_experts = experts;
  a.top_k = top_k;
  a.moe_inter_dim = moe_hidden;
  a.route_norm = true;
  return a;
}

// Mixtral (Mistral AI's Mixtral-8x7B / 8x22B config.json; Jiang et al. 2024): Llama attention
// and norms, every block 8 experts, softmax top-2, gates renormalized over the chosen two.
ModelArgs mixtral(const char* flavor, int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t hidden,
                  int64_t experts, int64_t vocab) {
  ModelArgs a = llama3(flavor, dim, layers, heads, kv, 0, 256, vocab, false, false, 8);
  a.name = "mixtral";
  a.ffn_hidden_dim = hidden;
  a.rope_theta = 1000000.0;
  a.num_experts = experts;
  a.top_k = 2;
  a.moe_inter_dim = hidden;
  a.route_norm = true;
  return a;
}

// Shapes from Meta's Llama 3 / 3.1 / 3.2 params.json (8B, 70B, 405B: 3.1; 1B, 3B: 3.2) and Qwen's
// Qwen3 config.json files; the debug models are TorchTitan's. Vectors, not maps, so that
// `meshtrain model list` shows the flavors smallest first as published.
using Flavors = std::vector<std::pair<std::string, ModelArgs>>;
const std::vector<std::pair<std::string, Flavors>>& table() {
  static const std::vector<std::pair<std::string, Flavors>> t = {
      {"llama3",
       {{"debugmodel", llama3("debugmodel", 256, 6, 16, 16, 0, 256, 2048, false, false, 8)},
        {"1B", llama3("1B", 2048, 16, 32, 8, 1.5, 256, 128256, true, true, 32)},
        {"3B", llama3("3B", 3072, 28, 24, 8, 1.0, 256, 128256, true, true, 32)},
        {"8B", llama3("8B", 4096, 32, 32, 8, 1.3, 1024, 128256, false, true, 8)},
        {"70B", llama3("70B", 8192, 80, 64, 8, 1.3, 4096, 128256, false, true, 8)},
        {"405B", llama3("405B", 16384, 126, 128, 8, 1.2, 4096, 128256, false, true, 8)}}},
      {"qwen3",
       {{"debugmodel", qwen3("debugmodel", 256, 6, 16, 8, 16, 768, 2048, false)},
        {"0.6B", qwen3("0.6B", 1024, 28, 16, 8, 128, 3072, 151936, true)},
        {"1.7B", qwen3("1.7B", 2048, 28, 16, 8, 128, 6144, 151936, true)},
        {"4B", qwen3("4B", 2560, 36, 32, 8, 128, 9728, 151936, true)},
        {"8B", qwen3("8B", 4096, 36, 32, 8, 128, 12288, 151936, false)},
        {"14B", qwen3("14B", 5120, 40, 40, 8, 128, 17408, 151936, false)},
        {"32B", qwen3("32B", 5120, 64, 64, 8, 128, 25600, 151936, false)},
        {"debugmodel_moe", qwen3_moe("debugmodel_moe", 256, 8, 16, 8, 3072, 64, 8, 768, 2048, 1000000.0)},
        {"30B-A3B", qwen3_moe("30B-A3B", 2048, 48, 32, 4, 6144, 128, 8, 768, 151936, 1000000.0)},
        {"235B-A22B", qwen3_moe("235B-A22B", 4096, 94, 64, 4, 12288, 128, 8, 1536, 151936, 5000000.0)}}},
      {"mixtral",
       {{"debugmodel", mixtral("debugmodel", 256, 6, 16, 8, 512, 8, 2048)},
        {"8x7B", mixtral("8x7B", 4096, 32, 32, 8, 14336, 8, 32000)},
        {"8x22B", mixtral("8x22B", 6144, 56, 48, 8, 16384, 8, 32768)}}},
  };
  return t;
}

}  // namespace

namespace {

template <class V>
const V* lookup(const std::vector<std::pair<std::string, V>>& v, const std::string& key) {
  for (const auto& [k, x] : v)
    if (k == key) return &x;
  return nullptr;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const auto& [k, _] : table()) out.push_back(k);
  return out;
}

std::vector<std::string> model_flavors(const std::string& name) {
  std::vector<std::string> out;
  if (const Flavors* f = lookup(table(), name))
    for (const auto& [k, _] : *f) out.push_back(k);
  return out;
}

ModelArgs model_flavor(const std::string& name, const std::string& flavor) {
  const Flavors* f = lookup(table(), name);
  if (!f) throw std::out_of_range("unknown model name '" + name + "'");
  const ModelArgs* a = lookup(*f, flavor);
  if (!a) throw std::out_of_range("unknown flavor '" + flavor + "' of model '" + name + "'");
  return *a;
}

}  // namespace meshtrain
