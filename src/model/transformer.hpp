#pragma once
/// @file Transformer: the Llama-3 / Qwen3 decoder as a graph of units — tok_embeddings,
/// layers.0 … layers.{L-1}, output (norm + projection) — with its parameters in one flat buffer
/// and their gradients in another (DESIGN.md data flow step 5).
#include <memory>
#include <vector>

#include "config/model_args.hpp"
#include "model/layer.hpp"

namespace meshtrain {

/// Which replicated (full, unsharded) buffers the model allocates itself. Sharded data
/// parallelism leaves out what it shards: ZeRO-2 the gradients, FSDP (ZeRO-3) both; it then
/// binds Parameter::value / grad to its own per-unit buffers while a unit is gathered.
struct ModelStorage {
  bool params = true;
  bool grads = true;
};

class Transformer {
 public:
  /// Builds the layers and, per `storage`, allocates parameters (kParameters) and zeroed
  /// gradients (kGradients) on `dev` in one flat buffer each, in their tensor-parallel local
  /// shapes (tp: this rank's place in its tp group; the layers use tp.comm at run time).
  /// Values are uninitialized until init_weights().
  /// @throws std::invalid_argument when tp does not divide the heads, or leaves a tp rank
  /// without vocabulary rows or FFN hidden units.
  Transformer(const ModelArgs& args, Device& dev, ModelStorage storage = {}, const TensorParallel& tp = {});

  /// Layer-independent initialization: element i of parameter p is a pure function of
  /// (seed, p.name, i) (model/init.hpp), so every layout starts from identical weights.
  /// @throws std::logic_error when the model does not hold its parameters (FSDP initializes
  /// its shards itself).
  void init_weights(uint64_t seed);

  const ModelArgs& args() const { return args_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  /// Units in execution order (embedding, blocks, output head).
  const std::vector<Layer*>& units() const { return units_; }
  /// Every parameter once (a tied output projection is the embedding's), in unit order.
  const std::vector<Parameter*>& parameters() const { return params_; }
  /// Parameters of unit u, a contiguous range of the flat buffers.
  std::vector<Parameter*> unit_parameters(size_t u) const;
  /// The flat buffers: [total elements] each; parameter views index into them. Undefined
  /// tensors when `storage` left them out.
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  /// Sets every replicated gradient to zero (no-op when the model holds no gradients).
  void zero_grad();
  /// RoPE tables cos, sin [seq_len, head_dim/2] (Su et al. 2021, with Llama 3.1 frequency
  /// scaling when args.use_rope_scaling), computed once per seq_len and cached.
  std::pair<Tensor, Tensor> rope_tables(int64_t seq_len);
  /// The context of one micro-batch from `samples` [n, T+1] token ids (inputs [:, :T], targets
  /// [:, 1:]) uploaded to the device, with this model's RoPE tables for T and its tp group.
  StepContext make_context(const int32_t* samples, int64_t n, int64_t t, float loss_grad_scale, bool need_backward);
  /// Looks up a parameter by name; nullptr when absent.
  Parameter* find(const std::string& name) const;

 private:
  ModelArgs args_;
  Device& dev_;
  TensorParallel tp_;
  std::vector<std::unique_ptr<Layer>> owned_;
  std::vector<Layer*> units_;
  std::vector<Parameter*> params_;
  std::vector<std::pair<size_t, size_t>> unit_ranges_;  // [first, last) into params_
  Tensor flat_params_, flat_grads_;
  int64_t rope_len_ = -1;
  Tensor rope_cos_, rope_sin_;
};

/// The rotary frequencies θ_j = theta^(−2j/Dh), j < Dh/2, with Llama 3.1's scaling of low
/// frequencies (Meta's apply_scaling) when enabled. Returned in fp64.
std::vector<double> rope_frequencies(const ModelArgs& args);

}  // namespace meshtrain
