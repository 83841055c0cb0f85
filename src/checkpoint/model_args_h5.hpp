#pragma once
/// @file A model's arguments (config/model_args.hpp) as HDF5 attributes: written into model dumps
/// (root) and checkpoints (/meta), read back by `meshtrain ckpt export` and the validation scripts
/// (doc/checkpoint-format.md lists the attributes).
#include <hdf5.h>

#include <string>

#include "config/model_args.hpp"

namespace meshtrain {

/// Writes name, flavor, dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, ffn_dim (the
/// resolved FFN width H), norm_eps, rope_theta, the RoPE-scaling fields, qk_norm,
/// tie_word_embeddings and the Mixture-of-Experts fields (num_experts, top_k,
/// num_shared_experts, moe_inter_dim, n_dense_layers, moe_layer_step, route_norm, route_scale,
/// load_balance_coeff, aux_loss_coeff, z_loss_coeff, score_func) as scalar attributes of `loc`. @throws CheckpointError naming `path`.
void write_model_args(hid_t loc, const ModelArgs& a, const std::string& path);

/// Reads what write_model_args wrote; the FFN width comes back as ffn_hidden_dim, so
/// ffn_dim() is the stored H. Files without MoE attributes (written before MoE existed) read
/// as dense models. @throws CheckpointError naming `path` and a missing attribute.
ModelArgs read_model_args(hid_t loc, const std::string& path);

}  // namespace meshtrain
