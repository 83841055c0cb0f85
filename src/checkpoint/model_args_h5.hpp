#pragma once
/// @file A model's arguments (config/model_args.hpp) as HDF5 attributes: written into model dumps
/// (root) and checkpoints (/meta), read back by `meshtrain ckpt export` and the validation scripts
/// (doc/checkpoint-format.md lists the attributes).
#include <hdf5.h>

#include <string>

#include "config/model_args.hpp"

namespace meshtrain {

/// Writes name, flavor, dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, ffn_dim (the
/// resolved FFN width H), norm_eps, rope_theta, the RoPE-scaling fields, qk_norm and
/// tie_word_embeddings as scalar attributes of `loc`. @throws CheckpointError naming `path`.
void write_model_args(hid_t loc, const ModelArgs& a, const std::string& path);

/// Reads what write_model_args wrote; the FFN width comes back as ffn_hidden_dim, so
/// ffn_dim() is the stored H. @throws CheckpointError naming `path` and a missing attribute.
ModelArgs read_model_args(hid_t loc, const std::string& path);

}  // namespace meshtrain
