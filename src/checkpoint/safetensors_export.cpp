#include "checkpoint/safetensors_export.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "checkpoint/h5_util.hpp"
#include "checkpoint/model_args_h5.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "tensor/bf16.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

struct Entry {
  std::string name;  // meshtrain name (dataset /model/<name>)
  std::vector<hsize_t> dims;
};

herr_t collect(hid_t group, const char* name, const H5L_info_t*, void* data) {
  h5::Handle ds{-1, H5Dclose};
  H5E_BEGIN_TRY { ds.id = H5Dopen2(group, name, H5P_DEFAULT); }
  H5E_END_TRY;
  if (ds.id < 0) return -1;
  h5::Handle space{H5Dget_space(ds.id), H5Sclose};
  h5::Handle type{H5Dget_type(ds.id), H5Tclose};
  if (H5Tget_class(type.id) != H5T_FLOAT || H5Tget_size(type.id) != 4) return -2;
  std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id))));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  static_cast<std::vector<Entry>*>(data)->push_back({name, dims});
  return 0;
}

// Writes `bytes` to `f` or throws naming `path` (a full disk, an I/O error).
void write_all(std::FILE* f, const void* bytes, size_t n, const std::string& path) {
  if (n && std::fwrite(bytes, 1, n, f) != n) h5::fail(path, "write failed (disk full?)");
}

// Writes tmp with `fill(f)`, then flushes, fsyncs and closes it; on any failure removes tmp and
// throws naming it. Renaming into place is the caller's, once every output is complete.
template <class Fill>
void write_synced(const std::string& tmp, Fill fill) {
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) h5::fail(tmp, "cannot create");
  try {
    fill(f);
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  const bool ok = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    h5::fail(tmp, "flush / sync failed (disk full?)");
  }
}

void rename_into_place(const std::string& tmp, const std::string& path) {
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) h5::fail(path, "cannot rename from " + tmp + ": " + ec.message());
}

// The safetensors element types an export writes: name in the deck / command line, safetensors
// dtype, bytes per element.
struct ExportType {
  const char* name;
  const char* safetensors;
  size_t bytes;
};
constexpr ExportType kExportTypes[] = {{"float32", "F32", 4}, {"bfloat16", "BF16", 2}, {"float16", "F16", 2}};

// IEEE binary16 bits of `f`, rounded to nearest even (the compiler's _Float16 conversion, as
// numpy's astype(float16) and torch's .half()); overflow gives ±inf.
uint16_t half_from_float(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// `src` float32 values as `type`'s little-endian bytes.
std::vector<char> encode_values(const std::vector<float>& src, const ExportType& type) {
  std::vector<char> out(src.size() * type.bytes);
  if (type.bytes == 4) {
    std::memcpy(out.data(), src.data(), out.size());
    return out;
  }
  const bool bf16 = std::string_view(type.name) == "bfloat16";
  for (size_t i = 0; i < src.size(); ++i) {
    const uint16_t v = bf16 ? bf16_from_float(src[i]) : half_from_float(src[i]);
    std::memcpy(out.data() + 2 * i, &v, 2);
  }
  return out;
}


// Copies `from` into `tmp` (synced; renaming is the caller's).
void copy_synced(const std::string& from, const std::string& tmp) {
  std::FILE* in = std::fopen(from.c_str(), "rb");
  if (!in) h5::fail(from, "cannot read the tokenizer file");
  try {
    write_synced(tmp, [&](std::FILE* out) {
      char buf[1 << 16];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) write_all(out, buf, n, tmp);
      if (std::ferror(in)) h5::fail(from, "read error");
    });
  } catch (...) {
    std::fclose(in);
    throw;
  }
  std::fclose(in);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

nlohmann::json hf_config(const ModelArgs& a, int64_t seq_len, const std::string& path) {
  const bool qwen = a.name == "qwen3", moe = a.num_experts > 0;
  if (moe) {
    // What Qwen3MoeForCausalLM / MixtralForCausalLM compute: softmax top-k, no shared expert,
    // gates unscaled; Mixtral also renormalizes always and has every block MoE.
    const auto refuse = [&](const std::string& what) {
      h5::fail(path, "export of this Mixture-of-Experts model: " + what + " has no counterpart in Hugging Face's " +
                         (qwen ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM") + " (not implemented yet)");
    };
    if (a.score_func != "softmax") refuse("score_func \"" + a.score_func + "\"");
    if (a.route_scale != 1.0) refuse("route_scale " + std::to_string(a.route_scale));
    if (a.num_shared_experts > 0) refuse("a shared expert");
    if (!qwen && !a.route_norm) refuse("route_norm = false");
    if (!qwen && (a.n_dense_layers > 0 || a.moe_layer_step != 1)) refuse("a dense block");
  }
  if (!qwen && a.qk_norm)
    h5::fail(path, "a llama3 model with qk_norm has no Hugging Face architecture (LlamaForCausalLM has no q/k norm): "
                   "not implemented yet");
  const char* arch = moe ? (qwen ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM")
                         : (qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
  const char* type = moe ? (qwen ? "qwen3_moe" : "mixtral") : (qwen ? "qwen3" : "llama");
  nlohmann::json c = {
      {"architectures", {arch}},
      {"model_type", type},
      {"hidden_size", a.dim},
      {"intermediate_size", a.ffn_dim()},
      {"num_hidden_layers", a.n_layers},
      {"num_attention_heads", a.n_heads},
      {"num_key_value_heads", a.n_kv_heads},
      {"head_dim", a.head_dim},
      {"vocab_size", a.vocab_size},
      {"rms_norm_eps", a.norm_eps},
      {"rope_theta", a.rope_theta},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"tie_word_embeddings", a.tie_word_embeddings},
      {"torch_dtype", "float32"},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  if (!qwen && !moe) c["mlp_bias"] = false;
  if (qwen) c["use_sliding_window"] = false, c["sliding_window"] = nullptr, c["max_window_layers"] = a.n_layers;
  if (moe && qwen) {
    std::vector<int64_t> dense;
    for (int64_t i = 0; i < a.n_layers; ++i)
      if (!a.is_moe_layer(i) && i < a.n_dense_layers) dense.push_back(i);
    c["num_experts"] = a.num_experts;
    c["num_experts_per_tok"] = a.top_k;
    c["moe_intermediate_size"] = a.moe_inter_dim;
    c["norm_topk_prob"] = a.route_norm;
    c["decoder_sparse_step"] = a.moe_layer_step;  // block i sparse when (i + 1) % step == 0, as ours
    c["mlp_only_layers"] = dense;
    c["router_aux_loss_coef"] = a.aux_loss_coeff;
    c["output_router_logits"] = false;
  }
  if (moe && !qwen) {
    c["intermediate_size"] = a.moe_inter_dim;
    c["num_local_experts"] = a.num_experts;
    c["num_experts_per_tok"] = a.top_k;
    c["router_aux_loss_coef"] = a.aux_loss_coeff;
    c["output_router_logits"] = false;
    c["sliding_window"] = nullptr;
  }
  if (a.use_rope_scaling) {
    // Llama 3.1 scaling as transformers names it (rope_type "llama3").
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", a.rope_scaling_factor},
                         {"low_freq_factor", a.rope_low_freq_factor},
                         {"high_freq_factor", a.rope_high_freq_factor},
                         {"original_max_position_embeddings", a.rope_original_max_seq_len}};
    c["max_position_embeddings"] = std::max<int64_t>(seq_len, int64_t(double(a.rope_original_max_seq_len) * a.rope_scaling_factor));
  } else {
    c["rope_scaling"] = nullptr;
    c["max_position_embeddings"] = seq_len;
  }
  return c;
}

std::string hf_parameter_name(const std::string& name) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"}, {"norm.weight", "model.norm.weight"}, {"output.weight", "lm_head.weight"}};
  static const std::pair<const char*, const char*> kBlock[] = {
      {"attention_norm.weight", "input_layernorm.weight"},  {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attention.wq.weight", "self_attn.q_proj.weight"},   {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},   {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_norm.weight"}, {"attention.k_norm.weight", "self_attn.k_norm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},   {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"}};
  for (const auto& [from, to] : kTop)
    if (name == from) return to;
  const std::string prefix = "layers.";
  const size_t dot = name.find('.', prefix.size());
  if (name.rfind(prefix, 0) == 0 && dot != std::string::npos && dot > prefix.size() &&
      name.find_first_not_of("0123456789", prefix.size()) == dot) {
    const std::string rest = name.substr(dot + 1);
    for (const auto& [from, to] : kBlock)
      if (rest == from) return "model." + name.substr(0, dot + 1) + to;
  }
  throw CheckpointError("parameter " + name + " has no Hugging Face counterpart");
}

std::string hf_moe_parameter_name(const std::string& name, bool qwen, int64_t expert) {
  const std::string prefix = "layers.";
  const size_t dot = name.find('.', prefix.size());
  if (name.rfind(prefix, 0) != 0 || dot == std::string::npos ||
      name.find_first_not_of("0123456789", prefix.size()) != dot)
    return hf_parameter_name(name);
  const std::string block = "model." + name.substr(0, dot + 1) + (qwen ? "mlp." : "block_sparse_moe.");
  const std::string rest = name.substr(dot + 1), e = std::to_string(expert);
  if (rest == "moe.router.gate.weight" && expert < 0) return block + "gate.weight";
  // w1 = gate, w3 = up, w2 = down (Meta's SwiGLU names; Mixtral keeps them).
  static const std::pair<const char*, const char*> kExperts[] = {
      {"moe.experts.w1", "gate_proj"}, {"moe.experts.w2", "down_proj"}, {"moe.experts.w3", "up_proj"}};
  for (const auto& [from, to] : kExperts)
    if (rest == from && expert >= 0)
      return block + "experts." + e + "." + (qwen ? std::string(to) : rest.substr(rest.size() - 2)) + ".weight";
  return hf_parameter_name(name);
}

std::vector<float> permute_rope_rows(const std::vector<float>& src, int64_t rows, int64_t cols, int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 2 || rows % head_dim || int64_t(src.size()) != rows * cols)
    throw std::invalid_argument("permute_rope_rows: rows must be whole heads of an even head_dim");
  std::vector<float> out(src.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < rows / head_dim; ++h)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t j = 0; j < half; ++j) {
        const float* from = src.data() + (h * head_dim + 2 * j + c) * cols;
        std::copy(from, from + cols, out.data() + (h * head_dim + c * half + j) * cols);
      }
  return out;
}

const std::vector<std::string>& hf_tokenizer_files() {
  static const std::vector<std::string> names = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                                 "special_tokens_map.json", "generation_config.json"};
  return names;
}

std::string checkpoint_deck(const std::string& path) {
  h5::Handle file{-1, H5Fclose};
  H5E_BEGIN_TRY { file.id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (file.id < 0) h5::fail(path, "cannot open as an HDF5 checkpoint (missing, truncated or not HDF5)");
  h5::Handle g{-1, H5Gclose};
  H5E_BEGIN_TRY { g.id = H5Gopen2(file.id, "/meta", H5P_DEFAULT); }
  H5E_END_TRY;
  if (g.id < 0) h5::fail(path, "not a meshtrain checkpoint (no /meta)");
  return h5::read_string_attr(g.id, "deck", path);
}

ExportSummary export_safetensors(const std::string& path, const std::string& out_dir, const std::string& hf_assets_dir,
                                 const std::string& dtype) {
  h5::Handle file{-1, H5Fclose};
  H5E_BEGIN_TRY { file.id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  H5E_END_TRY;
  if (file.id < 0) h5::fail(path, "cannot open as an HDF5 checkpoint (missing, truncated or not HDF5)");
  ModelArgs args;
  int64_t seq_len = 0;
  std::string version;
  {
    h5::Handle g{-1, H5Gclose};
    H5E_BEGIN_TRY { g.id = H5Gopen2(file.id, "/meta", H5P_DEFAULT); }
    H5E_END_TRY;
    if (g.id < 0 || h5::read_string_attr(g.id, "format", path) != "meshtrain-checkpoint")
      h5::fail(path, "not a meshtrain checkpoint (no /meta format)");
    seq_len = h5::read_int_attr(g.id, "seq_len", path);
    version = h5::read_string_attr(g.id, "meshtrain_version", path);
    h5::Handle a{-1, H5Gclose};
    H5E_BEGIN_TRY { a.id = H5Gopen2(g.id, "model_args", H5P_DEFAULT); }
    H5E_END_TRY;
    if (a.id < 0) h5::fail(path, "missing /meta/model_args");
    args = read_model_args(a.id, path);
  }
  ExportSummary summary;
  {
    h5::Handle g{H5Gopen2(file.id, "/train_state", H5P_DEFAULT), H5Gclose};
    if (g.id < 0) h5::fail(path, "missing /train_state");
    summary.step = h5::read_int_attr(g.id, "step", path);
  }
  verify_checksums(file.id, 0, 1, path);  // never export a damaged checkpoint

  std::vector<Entry> entries;
  {
    h5::Handle model{-1, H5Gclose};
    H5E_BEGIN_TRY { model.id = H5Gopen2(file.id, "/model", H5P_DEFAULT); }
    H5E_END_TRY;
    if (model.id < 0) h5::fail(path, "missing group /model");
    herr_t r = 0;
    H5E_BEGIN_TRY { r = H5Literate(model.id, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &entries); }
    H5E_END_TRY;
    if (r == -2) h5::fail(path, "a /model dataset is not float32 (bfloat16 export is not implemented yet)");
    if (r < 0) h5::fail(path, "cannot list /model");
  }
  const ExportType* type = nullptr;
  for (const ExportType& t : kExportTypes)
    if (dtype == t.name) type = &t;
  if (!type) h5::fail(out_dir, "export dtype '" + dtype + "' is not one of float32, bfloat16, float16");
  nlohmann::json config = hf_config(args, seq_len, path);
  config["torch_dtype"] = dtype;
  summary.architecture = config["architectures"][0];

  // Header: {hf name: {dtype, shape, data_offsets [begin, end) in the data section}}; the data
  // section follows in the header's (sorted) key order. An expert-first MoE dataset [E, …]
  // becomes E tensors, one per expert (slab e of dim 0).
  struct Source {
    size_t entry;
    int64_t expert;  // −1: the whole dataset
    std::vector<hsize_t> dims;
  };
  std::map<std::string, Source> order;  // hf name → where its values come from
  const bool qwen = args.name == "qwen3";
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (ends_with(e.name, ".moe.expert_bias")) {
      // Hugging Face's routers have no selection bias: exportable only when it never moved.
      std::vector<float> b(size_t(e.dims.at(0)));
      const std::string ds_name = "/model/" + e.name;
      h5::Handle ds{H5Dopen2(file.id, ds_name.c_str(), H5P_DEFAULT), H5Dclose};
      if (ds.id < 0 || H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data()) < 0)
        h5::fail(path, "cannot read dataset " + ds_name);
      for (float v : b)
        if (v != 0.0f)
          h5::fail(path, "dataset " + ds_name + " is not zero: the expert-selection bias of auxiliary-loss-free "
                         "balancing has no counterpart in Hugging Face's routers (train with [model] "
                         "load_balance_coeff = 0 to export; exporting with the bias is not implemented yet)");
      continue;
    }
    try {
      if (args.num_experts > 0 && e.name.find(".moe.experts.") != std::string::npos) {
        for (hsize_t x = 0; x < e.dims.at(0); ++x)
          order[hf_moe_parameter_name(e.name, qwen, int64_t(x))] =
              Source{i, int64_t(x), std::vector<hsize_t>(e.dims.begin() + 1, e.dims.end())};
      } else {
        order[args.num_experts > 0 ? hf_moe_parameter_name(e.name, qwen, -1) : hf_parameter_name(e.name)] =
            Source{i, -1, e.dims};
      }
    } catch (const CheckpointError&) {
      h5::fail(path, "dataset /model/" + e.name + " has no Hugging Face counterpart");
    }
  }
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"},
                            {"producer", "meshtrain " + version},
                            {"source", std::filesystem::path(path).filename().string()},
                            {"step", std::to_string(summary.step)}};
  uint64_t offset = 0;
  for (const auto& [hf, src] : order) {
    uint64_t n = type->bytes;
    for (hsize_t d : src.dims) n *= d;
    header[hf] = {{"dtype", type->safetensors}, {"shape", src.dims}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) h5::fail(out_dir, "cannot create the export folder: " + ec.message());
  const std::filesystem::path dir(out_dir);
  const std::string st_path = (dir / "model.safetensors").string(), st_tmp = st_path + ".tmp";
  const std::string cfg_path = (dir / "config.json").string(), cfg_tmp = cfg_path + ".tmp";
  write_synced(st_tmp, [&](std::FILE* f) {
    static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian u64 and float32");
    const uint64_t header_len = text.size();
    write_all(f, &header_len, sizeof header_len, st_tmp);
    write_all(f, text.data(), text.size(), st_tmp);
    std::vector<float> host;
    for (const auto& [hf, src] : order) {
      const Entry& e = entries[src.entry];
      const std::string ds_name = "/model/" + e.name;
      h5::Handle ds{H5Dopen2(file.id, ds_name.c_str(), H5P_DEFAULT), H5Dclose};
      hsize_t n = 1;
      for (hsize_t d : src.dims) n *= d;
      host.resize(size_t(n));
      bool ok = ds.id >= 0;
      if (ok && src.expert < 0) {
        ok = H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()) >= 0;
      } else if (ok) {  // slab `expert` of dim 0
        std::vector<hsize_t> start(e.dims.size(), 0), count = e.dims;
        start[0] = hsize_t(src.expert);
        count[0] = 1;
        h5::Handle space{H5Dget_space(ds.id), H5Sclose};
        h5::Handle mem{H5Screate_simple(1, &n, nullptr), H5Sclose};
        ok = H5Sselect_hyperslab(space.id, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) >= 0 &&
             H5Dread(ds.id, H5T_NATIVE_FLOAT, mem.id, space.id, H5P_DEFAULT, host.data()) >= 0;
      }
      if (!ok) h5::fail(path, "cannot read dataset " + ds_name);
      const bool q = ends_with(e.name, ".wq.weight") || ends_with(e.name, ".q_norm.weight");
      const bool k = ends_with(e.name, ".wk.weight") || ends_with(e.name, ".k_norm.weight");
      if (q || k) {
        const int64_t rows = int64_t(e.dims[0]), cols = e.dims.size() > 1 ? int64_t(e.dims[1]) : 1;
        host = permute_rope_rows(host, rows, cols, args.head_dim);
      }
      const std::vector<char> bytes = encode_values(host, *type);
      write_all(f, bytes.data(), bytes.size(), st_tmp);
    }
  });
  const std::string cfg_text = config.dump(2) + "\n";
  std::vector<std::string> written = {st_tmp};  // removed if a later file fails
  try {
    write_synced(cfg_tmp, [&](std::FILE* f) { write_all(f, cfg_text.data(), cfg_text.size(), cfg_tmp); });
    written.push_back(cfg_tmp);
    for (const std::string& name : hf_assets_dir.empty() ? std::vector<std::string>{} : hf_tokenizer_files()) {
      const std::filesystem::path from = std::filesystem::path(hf_assets_dir) / name;
      if (!std::filesystem::is_regular_file(from, ec)) continue;
      const std::string tmp = (dir / name).string() + ".tmp";
      copy_synced(from.string(), tmp);
      written.push_back(tmp);
      summary.tokenizer_files.push_back(name);
    }
  } catch (...) {
    for (const std::string& tmp : written) std::remove(tmp.c_str());
    throw;
  }
  // Every file is complete and synced before any takes its final name.
  rename_into_place(st_tmp, st_path);
  rename_into_place(cfg_tmp, cfg_path);
  for (const std::string& name : summary.tokenizer_files)
    rename_into_place((dir / name).string() + ".tmp", (dir / name).string());
  summary.tensors = int64_t(order.size());
  summary.bytes = int64_t(sizeof(uint64_t) + text.size() + offset);
  return summary;
}

}  // namespace meshtrain
