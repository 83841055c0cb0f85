#include "checkpoint/model_args_h5.hpp"

#include <utility>

#include "checkpoint/h5_util.hpp"

namespace meshtrain {

void write_model_args(hid_t loc, const ModelArgs& a, const std::string& path) {
  h5::write_attr(loc, "name", a.name, path);
  h5::write_attr(loc, "flavor", a.flavor, path);
  for (auto [name, v] : {std::pair{"dim", a.dim}, {"n_layers", a.n_layers}, {"n_heads", a.n_heads},
                         {"n_kv_heads", a.n_kv_heads}, {"head_dim", a.head_dim}, {"vocab_size", a.vocab_size},
                         {"ffn_dim", a.ffn_dim()}, {"rope_original_max_seq_len", a.rope_original_max_seq_len},
                         {"use_rope_scaling", int64_t(a.use_rope_scaling)}, {"qk_norm", int64_t(a.qk_norm)},
                         {"tie_word_embeddings", int64_t(a.tie_word_embeddings)}})
    h5::write_attr(loc, name, int64_t(v), path);
  for (auto [name, v] : {std::pair{"norm_eps", a.norm_eps}, {"rope_theta", a.rope_theta},
                         {"rope_scaling_factor", a.rope_scaling_factor},
                         {"rope_low_freq_factor", a.rope_low_freq_factor},
                         {"rope_high_freq_factor", a.rope_high_freq_factor}})
    h5::write_attr(loc, name, double(v), path);
  // Mixture of Experts (num_experts 0: dense).
  for (auto [name, v] : {std::pair{"num_experts", a.num_experts}, {"top_k", a.top_k},
                         {"num_shared_experts", a.num_shared_experts}, {"moe_inter_dim", a.moe_inter_dim},
                         {"n_dense_layers", a.n_dense_layers}, {"moe_layer_step", a.moe_layer_step},
                         {"route_norm", int64_t(a.route_norm)}})
    h5::write_attr(loc, name, int64_t(v), path);
  for (auto [name, v] : {std::pair{"route_scale", a.route_scale}, {"load_balance_coeff", a.load_balance_coeff},
                         {"aux_loss_coeff", a.aux_loss_coeff}, {"z_loss_coeff", a.z_loss_coeff}})
    h5::write_attr(loc, name, double(v), path);
  h5::write_attr(loc, "score_func", a.score_func, path);
}

ModelArgs read_model_args(hid_t loc, const std::string& path) {
  ModelArgs a;
  a.name = h5::read_string_attr(loc, "name", path);
  a.flavor = h5::read_string_attr(loc, "flavor", path);
  auto i = [&](const char* n) { return h5::read_int_attr(loc, n, path); };
  auto d = [&](const char* n) { return h5::read_double_attr(loc, n, path); };
  a.dim = i("dim");
  a.n_layers = i("n_layers");
  a.n_heads = i("n_heads");
  a.n_kv_heads = i("n_kv_heads");
  a.head_dim = i("head_dim");
  a.vocab_size = i("vocab_size");
  a.ffn_hidden_dim = i("ffn_dim");
  a.rope_original_max_seq_len = i("rope_original_max_seq_len");
  a.use_rope_scaling = i("use_rope_scaling") != 0;
  a.qk_norm = i("qk_norm") != 0;
  a.tie_word_embeddings = i("tie_word_embeddings") != 0;
  a.norm_eps = d("norm_eps");
  a.rope_theta = d("rope_theta");
  a.rope_scaling_factor = d("rope_scaling_factor");
  a.rope_low_freq_factor = d("rope_low_freq_factor");
  a.rope_high_freq_factor = d("rope_high_freq_factor");
  // Files written before MoE models existed have no MoE attributes: dense.
  if (H5Aexists(loc, "num_experts") > 0) {
    a.num_experts = i("num_experts");
    a.top_k = i("top_k");
    a.num_shared_experts = i("num_shared_experts");
    a.moe_inter_dim = i("moe_inter_dim");
    a.n_dense_layers = i("n_dense_layers");
    a.moe_layer_step = i("moe_layer_step");
    a.route_norm = i("route_norm") != 0;
    a.route_scale = d("route_scale");
    a.load_balance_coeff = d("load_balance_coeff");
    a.aux_loss_coeff = d("aux_loss_coeff");
    a.z_loss_coeff = d("z_loss_coeff");
    a.score_func = h5::read_string_attr(loc, "score_func", path);
  }
  return a;
}

}  // namespace meshtrain
