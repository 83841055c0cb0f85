#pragma once
/// @file `meshtrain ckpt export --format safetensors`: a checkpoint's parameters as a Hugging Face
/// model folder (model.safetensors + config.json) that transformers' LlamaForCausalLM /
/// Qwen3ForCausalLM / Qwen3MoeForCausalLM / MixtralForCausalLM load (doc/checkpoint-format.md,
/// "Export").
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/model_args.hpp"

namespace meshtrain {

/// The config.json (as JSON) of model `a` in Hugging Face's naming: architectures, model_type
/// ("llama", "qwen3", "qwen3_moe", "mixtral"), the widths, heads, vocabulary, rms_norm_eps,
/// rope_theta and rope_scaling (Llama 3.1's "llama3" type), tie_word_embeddings, the MoE fields;
/// max_position_embeddings from `seq_len`; torch_dtype "float32". Export writes it; import
/// (hf_import.hpp) checks a folder's config.json against it.
/// @throws CheckpointError naming `path` when the model has no Hugging Face architecture (a
/// shared expert, sigmoid routing, route_scale ≠ 1, a dense block in Mixtral, Llama with qk_norm).
nlohmann::json hf_config(const ModelArgs& a, int64_t seq_len, const std::string& path);

/// The Hugging Face name of a meshtrain (Meta-layout) parameter name, e.g.
/// "layers.3.attention.wq.weight" → "model.layers.3.self_attn.q_proj.weight".
/// @throws CheckpointError naming the parameter when it has no Hugging Face counterpart.
std::string hf_parameter_name(const std::string& name);

/// The Hugging Face name of a parameter of a Mixture-of-Experts model: Qwen3MoeForCausalLM
/// (`qwen`: model.layers.{i}.mlp.gate.weight, mlp.experts.{e}.{gate,up,down}_proj.weight) or
/// MixtralForCausalLM (block_sparse_moe.gate.weight, block_sparse_moe.experts.{e}.w{1,2,3}.weight).
/// `expert` names the slab of an expert-first dataset (layers.{i}.moe.experts.w1 [E, H, D] …);
/// −1 for every other parameter, which maps as hf_parameter_name.
/// @throws CheckpointError naming the parameter when it has no counterpart.
std::string hf_moe_parameter_name(const std::string& name, bool qwen, int64_t expert);

/// Reorders the rows of a [heads·Dh, cols] tensor, head by head, from Meta's interleaved RoPE
/// pairs (2j, 2j+1) to Hugging Face's rotate-half pairs (j, j + Dh/2): within a head, new row
/// c·Dh/2 + j is old row 2j + c (the inverse of the permutation in transformers'
/// convert_llama_weights_to_hf.py). Used for wq, wk (cols = D) and the Qwen3 q/k norms (cols = 1).
/// `src` and the result are [rows·cols] float32, row-major. @throws std::invalid_argument when
/// rows is not a multiple of an even head_dim.
std::vector<float> permute_rope_rows(const std::vector<float>& src, int64_t rows, int64_t cols, int64_t head_dim);

/// What export_safetensors wrote.
struct ExportSummary {
  int64_t tensors = 0;        ///< tensors in model.safetensors
  int64_t bytes = 0;          ///< size of model.safetensors (bytes)
  int64_t step = 0;           ///< the checkpoint's step
  std::string architecture;   ///< "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM" or "MixtralForCausalLM"
  std::vector<std::string> tokenizer_files;  ///< file names copied from the assets folder
};

/// The Hugging Face tokenizer files an export copies from an assets folder when present
/// (tokenizer.json, tokenizer.model, tokenizer_config.json, special_tokens_map.json,
/// generation_config.json): what transformers' AutoTokenizer and generate() read next to the
/// weights. Throws nothing.
const std::vector<std::string>& hf_tokenizer_files();

/// The resolved deck stored in checkpoint `path` (/meta attribute "deck"), as TOML text.
/// @throws CheckpointError naming the file: not a checkpoint, no deck.
std::string checkpoint_deck(const std::string& path);

/// Writes `out_dir`/model.safetensors and `out_dir`/config.json from checkpoint `path` (serial, no
/// MPI): every /model/<name> dataset under its Hugging Face name in `dtype` ("float32", or
/// "bfloat16" / "float16": rounded to nearest even from the float32 masters, as torch's .to()
/// rounds; config.json's torch_dtype says which), wq / wk (and q/k
/// norms) permuted for Hugging Face's rotary layout, config.json from /meta/model_args. With
/// `hf_assets_dir` (a folder, "" = none), each of hf_tokenizer_files() it holds is copied too, so
/// the export loads with its tokenizer. The checkpoint's checksums are verified first. Each file
/// is written as NAME.tmp, synced and renamed once all are complete, so a failure leaves no
/// partial export under the final names. Creates `out_dir` if missing.
/// @throws CheckpointError naming the file: not a checkpoint, a failed checksum, a dataset that is
/// not float32, a parameter with no Hugging Face counterpart, an unreadable tokenizer file, a
/// write error, an unknown `dtype`.
ExportSummary export_safetensors(const std::string& path, const std::string& out_dir,
                                 const std::string& hf_assets_dir = "", const std::string& dtype = "float32");

}  // namespace meshtrain
