#include "checkpoint/hf_import.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/safetensors_export.hpp"
#include "checkpoint/safetensors_reader.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

using nlohmann::json;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// transformers' default for a field config.json may omit (LlamaConfig, Qwen3Config,
// Qwen3MoeConfig, MixtralConfig), given the fields the file does hold; null when the field has
// no default (it must be present).
json default_of(const std::string& field, const json& file) {
  if (field == "head_dim" && file.contains("hidden_size") && file.contains("num_attention_heads") &&
      file["num_attention_heads"].is_number_integer() && file["num_attention_heads"].get<int64_t>() > 0)
    return file["hidden_size"].get<int64_t>() / file["num_attention_heads"].get<int64_t>();
  if (field == "num_key_value_heads" && file.contains("num_attention_heads")) return file["num_attention_heads"];
  if (field == "tie_word_embeddings" || field == "attention_bias" || field == "mlp_bias" ||
      field == "use_sliding_window" || field == "norm_topk_prob")
    return false;
  if (field == "hidden_act") return "silu";
  if (field == "rope_scaling") return json();
  if (field == "mlp_only_layers") return json::array();
  if (field == "decoder_sparse_step") return 1;
  return json();
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::fabs(x - y) <= 1e-9 * std::max(std::fabs(x), std::fabs(y));
  }
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : b.items())
      if (!a.contains(k) || !same_value(a[k], v)) return false;
    return true;
  }
  return a == b;
}

// Row pieces for rows [r0, r0 + rows) × cols [c0, c0 + cols) of a tensor in meshtrain's layout,
// each read from Hugging Face row `map(r)`, into `dst` (row-major [rows, cols]).
template <class RowMap>
void add_box(std::vector<RowPiece>& out, int64_t r0, int64_t rows, int64_t c0, int64_t cols, float* dst, RowMap map) {
  for (int64_t r = 0; r < rows; ++r) out.push_back({map(r0 + r), c0, cols, dst + r * cols});
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

int64_t hf_rope_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, k = r % head_dim;
  return h * head_dim + (k % 2) * (head_dim / 2) + k / 2;
}

void check_hf_config(const std::string& dir, const ModelArgs& args) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  json file;
  {
    std::ifstream in(path);
    if (!in) throw CheckpointError(path + ": cannot read (a Hugging Face model folder holds config.json)");
    try {
      file = json::parse(in);
    } catch (const std::exception& e) {
      throw CheckpointError(path + ": not JSON: " + e.what());
    }
  }
  if (!file.is_object()) throw CheckpointError(path + ": not a JSON object");
  json deck;
  try {
    deck = hf_config(args, 0, path);
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (the deck's [model] cannot load Hugging Face weights)");
  }
  static const char* kFields[] = {"model_type",         "hidden_size",        "intermediate_size",   "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "head_dim",            "vocab_size",
                                  "rms_norm_eps",       "rope_theta",         "rope_scaling",        "tie_word_embeddings",
                                  "hidden_act",         "attention_bias",     "mlp_bias",            "use_sliding_window",
                                  "num_experts",        "num_local_experts",  "num_experts_per_tok", "moe_intermediate_size",
                                  "norm_topk_prob",     "decoder_sparse_step", "mlp_only_layers"};
  for (const char* field : kFields) {
    if (!deck.contains(field)) continue;
    json have = file.contains(field) ? file[field] : default_of(field, file);
    if (have.is_null() && !deck[field].is_null())
      throw CheckpointError(path + ": no field " + field + " (the deck's model has " + deck[field].dump() + ")");
    // transformers accepts the older "type" for rope_scaling's "rope_type".
    if (have.is_object() && have.contains("type") && !have.contains("rope_type")) have["rope_type"] = have["type"];
    if (!same_value(have, deck[field]))
      throw CheckpointError(path + ": " + field + " is " + have.dump() + ", the deck's model has " + deck[field].dump() +
                            " ([model] name \"" + args.name + "\", flavor \"" + args.flavor + "\")");
  }
}

std::vector<std::string> hf_tensor_names(const ModelArgs& args) {
  const bool moe = args.num_experts > 0, qwen = args.name == "qwen3";
  std::vector<std::string> meta = {"tok_embeddings.weight", "norm.weight"};
  if (!args.tie_word_embeddings) meta.push_back("output.weight");
  std::vector<std::string> out;
  for (int64_t i = 0; i < args.n_layers; ++i) {
    const std::string b = "layers." + std::to_string(i) + ".";
    for (const char* s : {"attention_norm.weight", "ffn_norm.weight", "attention.wq.weight", "attention.wk.weight",
                          "attention.wv.weight", "attention.wo.weight"})
      meta.push_back(b + s);
    if (args.qk_norm) meta.push_back(b + "attention.q_norm.weight"), meta.push_back(b + "attention.k_norm.weight");
    if (moe && args.is_moe_layer(i)) {
      meta.push_back(b + "moe.router.gate.weight");
      for (int64_t e = 0; e < args.num_experts; ++e)
        for (const char* w : {"moe.experts.w1", "moe.experts.w2", "moe.experts.w3"})
          out.push_back(hf_moe_parameter_name(b + w, qwen, e));
    } else {
      for (const char* w : {"feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight"})
        meta.push_back(b + w);
    }
  }
  for (const std::string& m : meta) out.push_back(moe ? hf_moe_parameter_name(m, qwen, -1) : hf_parameter_name(m));
  std::sort(out.begin(), out.end());
  return out;
}

HfLoadSummary load_hf_weights(const SafetensorsFolder& st, const ModelArgs& args, Device& dev, Transformer& model,
                              const std::vector<LocalShard>& shards) {
  const bool moe = args.num_experts > 0, qwen = args.name == "qwen3";
  // The folder must hold exactly the model's tensors: a missing one cannot be initialized from
  // it, an extra one (a bias, another architecture's layer) means another model.
  const std::vector<std::string> names = hf_tensor_names(args);
  const std::set<std::string> wanted(names.begin(), names.end());
  for (const std::string& n : names)
    if (!st.find(n)) throw CheckpointError(st.path() + ": no tensor " + n + " (the deck's model needs it)");
  for (const auto& [n, t] : st.tensors())
    if (!wanted.count(n) && !ends_with(n, "rotary_emb.inv_freq") && !(args.tie_word_embeddings && n == "lm_head.weight"))
      throw CheckpointError(t.file + ": tensor " + n + " has no counterpart in the deck's model ([model] name \"" +
                            args.name + "\", flavor \"" + args.flavor + "\")");
  auto check_shape = [&](const std::string& hf, const std::vector<int64_t>& need) {
    const SafetensorsTensor& t = *st.find(hf);
    if (t.shape != need)
      throw CheckpointError(t.file + ": tensor " + hf + " has shape " + shape_text(t.shape) + ", the deck's model needs " +
                            shape_text(need));
  };

  HfLoadSummary summary;
  summary.tensors = int64_t(st.tensors().size());
  std::vector<float> host;
  std::vector<hsize_t> start, count;
  for (const ParameterPiece& r : local_parameter_pieces(model, shards)) {
    const int64_t n = r.dst.numel();
    const Parameter& p = *r.p;
    shard_hyperslab(p, r.first_elem, n, start, count);
    float* dst = static_cast<float*>(dev.host_address(r.dst));
    if (!dst) host.resize(size_t(n)), dst = host.data();
    const bool rope = ends_with(p.name, ".wq.weight") || ends_with(p.name, ".wk.weight") ||
                      ends_with(p.name, ".q_norm.weight") || ends_with(p.name, ".k_norm.weight");
    const int64_t hd = args.head_dim;
    auto row_of = [rope, hd](int64_t r) { return rope ? hf_rope_row(r, hd) : r; };
    if (moe && p.name.find(".moe.experts.") != std::string::npos) {
      // Expert-first [E, H, D]: slab e of dim 0 is Hugging Face's per-expert tensor [H, D].
      const std::vector<int64_t> need(p.shape.begin() + 1, p.shape.end());
      const int64_t rows = int64_t(count[1]), cols = int64_t(count[2]);
      for (int64_t e = 0; e < int64_t(count[0]); ++e) {
        const std::string hf = hf_moe_parameter_name(p.name, qwen, int64_t(start[0]) + e);
        check_shape(hf, need);
        std::vector<RowPiece> pieces;
        add_box(pieces, int64_t(start[1]), rows, int64_t(start[2]), cols, dst + e * rows * cols, row_of);
        summary.bytes += st.read(hf, std::move(pieces));
      }
    } else {
      const std::string hf = moe ? hf_moe_parameter_name(p.name, qwen, -1) : hf_parameter_name(p.name);
      check_shape(hf, std::vector<int64_t>(p.shape.begin(), p.shape.end()));
      std::vector<RowPiece> pieces;
      if (p.shape.size() == 1) {  // a norm: one row; the q/k norms' elements are RoPE-permuted like rows
        for (int64_t x = 0; x < int64_t(count[0]); ++x)
          if (rope) pieces.push_back({0, hf_rope_row(int64_t(start[0]) + x, hd), 1, dst + x});
        if (!rope) pieces.push_back({0, int64_t(start[0]), int64_t(count[0]), dst});
      } else {
        add_box(pieces, int64_t(start[0]), int64_t(count[0]), int64_t(start[1]), int64_t(count[1]), dst, row_of);
      }
      summary.bytes += st.read(hf, std::move(pieces));
    }
    if (dst == host.data()) dev.upload(r.dst, host.data(), size_t(n) * sizeof(float));
    summary.elements += n;
  }
  model.params_changed();
  return summary;
}

}  // namespace meshtrain
