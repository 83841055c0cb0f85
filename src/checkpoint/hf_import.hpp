#pragma once
/// @file Loading a Hugging Face model folder (LlamaForCausalLM, Qwen3ForCausalLM,
/// Qwen3MoeForCausalLM, MixtralForCausalLM: config.json + model.safetensors or its index) into
/// any layout ([checkpoint] initial_load_path with initial_load_in_hf; doc/checkpoint-format.md,
/// "Import"). The inverse of safetensors_export.hpp: Hugging Face names map back to meshtrain's,
/// the rotate-half rows of q_proj / k_proj (and the Qwen3 q/k norms) go back to Meta's
/// interleaved RoPE pairs, per-expert tensors stack into the expert-first [E, H, D] parameters, a
/// tied model's output head reads embed_tokens. Each rank reads only the rows of its own shards.
#include <cstdint>
#include <string>
#include <vector>

#include "config/model_args.hpp"
#include "model/transformer.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

class SafetensorsFolder;

/// Checks `dir`/config.json against the deck's model `args`: model_type, the widths (hidden,
/// intermediate, head_dim), layers, heads, KV heads, vocabulary, rms_norm_eps, rope_theta and
/// rope_scaling, tie_word_embeddings, the activation and biases, and the MoE fields. A field the
/// file omits takes transformers' default (head_dim = hidden_size / num_attention_heads,
/// num_key_value_heads = num_attention_heads, tie_word_embeddings = false, ...).
/// @throws CheckpointError naming the file, the field, the file's value and the deck's value;
/// or the file missing or not JSON; or a model with no Hugging Face counterpart.
void check_hf_config(const std::string& dir, const ModelArgs& args);

/// The Hugging Face tensor names model `args` consists of (tok_embeddings, every block's
/// attention, norms and FFN or experts, norm, and lm_head unless tied), sorted.
/// @throws CheckpointError when the model has no Hugging Face counterpart.
std::vector<std::string> hf_tensor_names(const ModelArgs& args);

/// What load_hf_weights read on this rank.
struct HfLoadSummary {
  int64_t tensors = 0;   ///< tensors in the folder
  int64_t elements = 0;  ///< float32 values placed on this rank
  uint64_t bytes = 0;    ///< bytes read from disk on this rank
};

/// Reads every local parameter shard of `model` from the folder's safetensors (`st`, already
/// opened on `dir`): the whole tp slab of each parameter when the model holds replicated
/// parameters (DDP, ZeRO-1/2), else each FSDP shard (`shards`), through the global hyperslab
/// shard_hyperslab computes, so tp, pp, ep and FSDP layouts all read their own rows. bf16 / fp16
/// values are widened exactly to the float32 masters; the compute copies are refreshed
/// (params_changed). Not collective.
/// @throws CheckpointError naming the folder or file and tensor: a tensor missing, or one the
/// model has no place for, a shape other than the model's, an unsupported dtype, a short read.
HfLoadSummary load_hf_weights(const SafetensorsFolder& st, const ModelArgs& args, Device& dev, Transformer& model,
                              const std::vector<LocalShard>& shards);

/// Row `r` of a Meta-layout (interleaved RoPE pairs) q/k tensor is row hf_rope_row(r) of the
/// Hugging Face (rotate-half) tensor: within head h, Meta row 2j + c is Hugging Face row
/// c·Dh/2 + j (the inverse of permute_rope_rows). Throws nothing.
int64_t hf_rope_row(int64_t r, int64_t head_dim);

}  // namespace meshtrain
