#pragma once
/// @file ModelArgs: the shape of a Llama-3-style decoder, and the table of published flavors.
/// Lives in config/ (not model/) because validate(world_size) needs head counts before any
/// model is built; model/ turns ModelArgs into layers (doc/architecture.md).
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

/// Shape of one decoder model. Dimensions in elements; counts are per model.
struct ModelArgs {
  std::string name = "llama3";  ///< family: llama3 | qwen3 | mixtral
  std::string flavor = "debugmodel";
  int64_t dim = 256;            ///< model width D
  int64_t n_layers = 6;
  int64_t n_heads = 16;
  int64_t n_kv_heads = 16;      ///< grouped-query attention when < n_heads
  int64_t head_dim = 16;        ///< per-head width (dim / n_heads for Llama; explicit for Qwen3)
  int64_t vocab_size = 2048;
  int64_t multiple_of = 256;    ///< FFN hidden size rounded up to a multiple of this
  double ffn_dim_multiplier = 0;  ///< 0 = none
  int64_t ffn_hidden_dim = 0;   ///< explicit FFN width (Qwen3); 0 = derived from dim (see ffn_dim())
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  bool use_rope_scaling = false;  ///< Llama 3.1 frequency scaling
  double rope_scaling_factor = 8.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_seq_len = 8192;
  bool qk_norm = false;           ///< Qwen3 per-head RMSNorm on q and k
  bool tie_word_embeddings = false;
  /// TorchTitan's attention backend name (sdpa | flex | varlen, its llama3 model args): one
  /// kernel serves all three here, so it only names the flavor's choice (varlen requires
  /// block_causal, as TorchTitan's get_attention_masks).
  std::string attn_type = "sdpa";
  /// causal, or block_causal: causal within each document of a packed sample (documents end
  /// with their EOS token; TorchTitan's get_document_mask_mod).
  std::string attn_mask_type = "causal";

  // ---- Mixture of Experts (num_experts == 0: every block has the dense FFN) ----
  int64_t num_experts = 0;         ///< routed experts E per MoE block
  int64_t top_k = 1;               ///< experts chosen per token (token choice, dropless)
  int64_t num_shared_experts = 0;  ///< always-on experts, one SwiGLU FFN of num_shared_experts·moe_inter_dim
  int64_t moe_inter_dim = 0;       ///< hidden width of each routed (and shared) expert
  std::string score_func = "softmax";  ///< router scores: softmax | sigmoid
  bool route_norm = false;         ///< chosen gates renormalized to sum 1
  double route_scale = 1.0;        ///< gates multiplied by this
  double load_balance_coeff = 1e-3;  ///< auxiliary-loss-free bias step (DeepSeek-V3); 0 = off
  double aux_loss_coeff = 0;       ///< sequence-wise balance loss α (DeepSeek-V3 eq. 17); 0 = off
  double z_loss_coeff = 0;         ///< router z-loss β (ST-MoE eq. 5); 0 = off
  // ---- output head and loss (model/layers/embedding.hpp, OutputHead) ----
  double output_z_loss_coeff = 0;  ///< PaLM's z-loss ζ·log²Z on the output logits (PaLM §5); 0 = off
  int64_t loss_chunk_tokens = 0;   ///< tokens per head/loss chunk (chunked cross-entropy); 0 = unchunked
  /// loss_chunk_tokens must be a multiple of this (the CPU device's head GEMM block, so chunked
  /// and unchunked runs multiply the same row blocks and agree bitwise).
  static constexpr int64_t kLossChunkMultiple = 256;
  int64_t n_dense_layers = 0;      ///< the first n blocks keep the dense FFN (DeepSeek-V3's first_k_dense)
  int64_t moe_layer_step = 1;      ///< after those, block i is MoE when i % step == step − 1 (Llama 4's interleave step)

  /// Whether block `layer` has a MoE feed-forward (num_experts > 0, layer ≥ n_dense_layers and
  /// layer % moe_layer_step == moe_layer_step − 1).
  bool is_moe_layer(int64_t layer) const;
  /// Number of MoE blocks.
  int64_t num_moe_layers() const;
  /// Parameters of one MoE feed-forward: router E·D, routed experts E·3·D·H_moe, shared experts
  /// 3·D·(num_shared·H_moe). The expert bias is a buffer, not counted.
  int64_t moe_ffn_params() const;
  /// The part of moe_ffn_params() one token runs through: router, top_k experts, shared experts.
  int64_t moe_ffn_active_params() const;
  /// Parameters one token runs through: num_params() with each MoE block's routed experts
  /// counted top_k times instead of E times (equal to num_params() for dense models).
  int64_t active_params() const;

  /// FFN hidden width H. Llama (Meta's reference model.py): H = 2·(4D)/3, times
  /// ffn_dim_multiplier if set, rounded up to multiple_of; or ffn_hidden_dim when given.
  int64_t ffn_dim() const;
  /// Parameter count of the whole model (embedding and output counted once each; once if tied).
  int64_t num_params() const;
  /// Parameters of the token embedding (vocab × D).
  int64_t num_embedding_params() const;
  /// Parameters that take part in a matmul per token, N_matmul: every parameter but the
  /// embedding table (a lookup), with the output projection counted even when it is tied to the
  /// embedding — tied or not, it is a [D] x [D, V] matmul per token (about 19% of Llama 3.2 1B's
  /// FLOPs). The norms' weights (a few D per layer) stay in, as in TorchTitan's count.
  int64_t matmul_params() const;
  /// matmul_params() over active_params(): what one token's forward multiplies through.
  int64_t active_matmul_params() const;
  /// Training FLOPs per token for sequences of `seq_len` tokens, the convention of TorchTitan and
  /// PaLM (Chowdhery et al. 2022, appendix B): 6·N_matmul + 12·n_layers·n_heads·head_dim·seq_len,
  /// with N_matmul the active matmul parameters for MoE models (active FLOPs; MFU uses them)
  /// (forward + backward = 3 × forward, 2 FLOPs per multiply-add; attention scores and values at
  /// full length, no causal discount). MFU is computed from it.
  double flops_per_token(int64_t seq_len) const;
  /// The same formula with 6·(N − N_embedding) in place of 6·N_matmul: what TorchTitan prints
  /// for a tied model, whose shared weights it counts once, so the output projection drops out.
  /// Equal to flops_per_token() for untied models; shown by `meshtrain model info` beside it.
  double flops_per_token_without_tied_output(int64_t seq_len) const;
};

/// The published flavors of `name` (llama3: debugmodel, 1B, 3B, 8B, 70B, 405B; qwen3:
/// debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B, debugmodel_moe, 30B-A3B, 235B-A22B; mixtral:
/// debugmodel, 8x7B, 8x22B).
std::vector<std::string> model_flavors(const std::string& name);
/// The known model families ("llama3", "qwen3", "mixtral").
std::vector<std::string> model_names();
/// Looks up a flavor. @throws std::out_of_range for an unknown name or flavor.
ModelArgs model_flavor(const std::string& name, const std::string& flavor);

}  // namespace meshtrain
