#pragma once
/// @file Attention: grouped-query causal self-attention with RoPE and optional Qwen3 q/k norm.
#include "config/model_args.hpp"
#include "model/layer.hpp"

#include <functional>
#include <vector>

namespace meshtrain {

/// Document starts of packed samples for document masking (TorchTitan's block_causal,
/// torchtitan/models/attention.py get_document_mask_mod): samples [n, t + 1] token ids, of which
/// the inputs [:, :t] count; returns [n, t] row-major where entry (b, p) is the position of the
/// first token of p's document. A document ends with, and includes, its EOS token, so position
/// p starts a new document when p == 0 or token p − 1 is `eos_id`. Throws nothing.
std::vector<int32_t> document_starts(const int32_t* samples, int64_t n, int64_t t, int32_t eos_id);

/// wq [Hq·Dh, D], wk, wv [Hkv·Dh, D], wo [D, Hq·Dh]; q_norm, k_norm [Dh] when qk_norm.
/// forward: x [N, D] (already normed) → [N, D], N per tp_local_tokens. Under context
/// parallelism the tokens are this cp rank's chunks (chunk-major) and attention runs across the
/// cp group (parallel/context/cp_attention.hpp). With ctx.doc_start defined (attn_mask_type =
/// "block_causal") each token attends only to earlier tokens of its own document; RoPE keeps
/// the positions in the sample. Under tensor
/// parallelism wq, wk, wv are column-parallel (this rank's Hq/tp query and Hkv/tp kv heads;
/// local query head h still reads local kv head h / (Hq/Hkv)) and wo row-parallel: one tp_exit
/// in forward and one in backward. q_norm / k_norm stay replicated, their gradients partial.
class Attention final : public Layer {
 public:
  /// @throws std::invalid_argument when tp does not divide n_heads or n_kv_heads.
  Attention(const ModelArgs& args, int layer_id, const std::string& prefix, const TensorParallel& tp);
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  /// @throws std::logic_error when ctx.shard does not hold ctx.seq_len tokens per sample.
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;

  Parameter wq, wk, wv, wo, q_norm, k_norm;

 private:
  /// Runs the projection `linear` (x · Wᵀ, a kMatmul operator), applies q/k norm (Qwen3) and
  /// RoPE; pushes what backward needs.
  Tensor project_qk(StepContext& ctx, SavedTensors& saved, const std::function<Tensor()>& linear, Parameter& norm,
                    int64_t heads);
  Tensor project_qk_backward(StepContext& ctx, SavedTensors& saved, Tensor dq, Parameter& norm, int64_t heads);
  /// RoPE (inverse: its adjoint) in place on x [chunks·B, C, H, Dh], each local chunk of the
  /// sequence rotated by its tokens' global positions (ctx.shard).
  void rope_chunks(StepContext& ctx, const Tensor& x, bool inverse) const;
  std::string name_;
  int64_t n_heads_, n_kv_heads_, head_dim_;
  bool qk_norm_;
  float norm_eps_;
};

}  // namespace meshtrain
