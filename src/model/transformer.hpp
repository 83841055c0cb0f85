#pragma once
/// @file Transformer: the Llama-3 / Qwen3 decoder as a graph of units — tok_embeddings,
/// layers.0 … layers.{L-1}, output (norm + projection) — with its parameters in one flat buffer
/// and their gradients in another (DESIGN.md data flow step 5).
#include <memory>
#include <unordered_map>
#include <vector>

#include "config/model_args.hpp"
#include "model/layer.hpp"

namespace meshtrain {

class MoE;  // model/layers/moe.hpp

/// Which replicated (full, unsharded) buffers the model allocates itself. Sharded data
/// parallelism leaves out what it shards: ZeRO-2 the gradients, FSDP (ZeRO-3) both; it then
/// binds Parameter::value / grad to its own per-unit buffers while a unit is gathered.
struct ModelStorage {
  bool params = true;
  bool grads = true;
};

/// The part of the model one rank builds. Without pipeline parallelism that is the whole model;
/// a pipeline rank builds the transformer blocks of its stages (global indices, so parameter
/// names and initial values are those of the whole model), plus the embedding when it holds the
/// first stage and norm + output projection + loss when it holds the last (DESIGN.md, model
/// parts). A rank holding the output head of a tied model without the embedding keeps its own
/// copy of tok_embeddings.weight in the head (pipeline/tied_embeddings.hpp keeps the copies equal).
struct ModelPart {
  std::vector<int64_t> layers;  ///< global block indices, ascending
  bool embedding = true;        ///< tok_embeddings (the first stage)
  bool head = true;             ///< norm, output projection and loss (the last stage)
  /// Every block, the embedding and the head.
  static ModelPart whole(const ModelArgs& args);
  /// Whether this part is the whole model of `args`.
  bool is_whole(const ModelArgs& args) const;
};

class Transformer {
 public:
  /// Builds the layers and, per `storage`, allocates parameters (kParameters) and zeroed
  /// gradients (kGradients) on `dev` in one flat buffer each, in their tensor-parallel local
  /// shapes (tp: this rank's place in its tp group; the layers use tp.comm at run time).
  /// Values are uninitialized until init_weights().
  /// @throws std::invalid_argument when tp does not divide the heads, or leaves a tp rank
  /// without vocabulary rows or FFN hidden units.
  /// `compute_dtype` is the dtype of activations and of the parameter copies forward and
  /// backward read (f32, or bf16 for mixed precision: the f32 `value`s stay the master weights
  /// the optimizer updates; gradients stay f32).
  /// `part` (default: the whole model) selects the blocks, embedding and head built here.
  /// @throws std::invalid_argument also for a part naming a block outside [0, n_layers), out of
  /// order, or holding nothing.
  /// `ep` (default: size 1) splits the MoE blocks' routed experts over an expert-parallel group
  /// (each rank builds E/ep of them) and is the group make_context hands the layers.
  Transformer(const ModelArgs& args, Device& dev, ModelStorage storage = {}, const TensorParallel& tp = {},
              DType compute_dtype = DType::kF32, const ModelPart* part = nullptr, const ExpertParallel& ep = {});

  /// Layer-independent initialization: element i of parameter p is a pure function of
  /// (seed, p.name, i) (model/init.hpp), so every layout starts from identical weights.
  /// @throws std::logic_error when the model does not hold its parameters (FSDP initializes
  /// its shards itself).
  void init_weights(uint64_t seed);

  const ModelArgs& args() const { return args_; }
  /// The device holding this model's tensors.
  Device& device() const { return dev_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  const ExpertParallel& expert_parallel() const { return ep_; }
  /// Splits each sample's sequence over `cp` in make_context (default: size 1, whole sequences).
  /// The parameters do not depend on it. Throws nothing.
  void set_context_parallel(const ContextParallel& cp) { cp_ = cp; }
  const ContextParallel& context_parallel() const { return cp_; }
  /// The blocks, embedding and head this model holds.
  const ModelPart& part() const { return part_; }
  /// Units in execution order (embedding, blocks, output head), as far as part() holds them.
  const std::vector<Layer*>& units() const { return units_; }
  /// Per unit, its transformer block number (layers.{i} → i) or −1 for the embedding and the
  /// output head: the Executor's activation-checkpointing policy selects blocks by it.
  std::vector<int64_t> block_index() const;
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
  /// [:, 1:]) uploaded to the device, with this model's RoPE tables for T and its tp group. Under
  /// context parallelism only this cp rank's chunks of each sample (targets shifted first), in
  /// chunk-major order: ctx.seq_len = T / cp. @throws std::invalid_argument when 2·cp does not
  /// divide T.
  StepContext make_context(const int32_t* samples, int64_t n, int64_t t, float loss_grad_scale, bool need_backward);
  /// Whether `p` is this part's own copy of the tied tok_embeddings.weight, held by the output
  /// head of a part without the embedding (pipeline parallelism): the first stage's is the
  /// original, written to checkpoints and counted once in the gradient norm.
  bool is_tied_copy(const Parameter* p) const { return p->sharding.tied_copy; }
  /// Document masking (`[model] attn_mask_type = "block_causal"`): from now on make_context
  /// fills StepContext::doc_start from each sample's `eos_id` tokens (document_starts); a
  /// negative id turns it off (plain causal attention, the default). Throws nothing.
  void set_document_mask_eos(int32_t eos_id) { doc_eos_ = eos_id; }
  int32_t document_mask_eos() const { return doc_eos_; }
  /// The MoE layers of this part's blocks, in block order (empty for a dense model).
  const std::vector<MoE*>& moe_layers() const { return moe_layers_; }
  /// MoE blocks route round-robin by position ([debug] moe_force_load_balance) in every
  /// context make_context builds from now on. Throws nothing.
  void set_moe_force_load_balance(bool on) { moe_force_load_balance_ = on; }
  /// Looks up a parameter by name; nullptr when absent.
  Parameter* find(const std::string& name) const;

  // ---- mixed precision (compute_dtype bf16): Parameter::compute copies of the values ----
  DType compute_dtype() const { return compute_dtype_; }
  /// Makes Parameter::compute current for every parameter unit u reads (its own, and the tied
  /// embedding for the output head): casts value → compute where the value changed since the
  /// last cast. Binds compute into the model's flat bf16 buffer, or, when the model does not
  /// hold replicated parameters (FSDP), binds the unit's parameters that have no compute copy
  /// into one new buffer, which lives until release_compute unbinds them all. Parameters whose
  /// copies another owner bound (FSDP's bf16 gather; with expert parallelism two FSDP
  /// instances each bind their own) are left where they are. No-op for f32.
  /// @throws std::logic_error when a value is not bound (FSDP: not gathered).
  void ensure_compute(size_t u);
  /// The values of `ps` changed (gather, load): the next ensure_compute recasts them.
  void params_changed(const std::vector<Parameter*>& ps);
  /// Every parameter's value changed (optimizer step, load).
  void params_changed();
  /// The compute copies of `ps` were written directly (FSDP's bf16 gather): they are current,
  /// nothing to recast.
  void compute_written(const std::vector<Parameter*>& ps);
  /// Unbinds the compute copies of `ps` (FSDP after resharding); a per-unit buffer is freed
  /// once none of its parameters is bound. No-op when the model holds a flat compute buffer.
  void release_compute(const std::vector<Parameter*>& ps);
  /// p's compute copy as a flat bf16 [numel] view when this model holds the flat compute buffer
  /// (mixed precision with replicated parameters: the copy stays bound for the model's life);
  /// an undefined tensor otherwise (float32, or FSDP's per-unit copies). The optimizer may write
  /// it (Optimizer::write_compute_copies); compute_written then marks it current. Throws nothing.
  Tensor held_compute_copy(const Parameter& p) const;

 private:
  ModelArgs args_;
  ModelPart part_;
  Device& dev_;
  TensorParallel tp_;
  ContextParallel cp_;
  ExpertParallel ep_;
  std::vector<std::unique_ptr<Layer>> owned_;
  std::vector<Layer*> units_;
  std::vector<MoE*> moe_layers_;
  bool moe_force_load_balance_ = false;
  int32_t doc_eos_ = -1;  // set_document_mask_eos; < 0: no document mask
  std::vector<Parameter*> params_;
  std::vector<std::pair<size_t, size_t>> unit_ranges_;  // [first, last) into params_
  Tensor flat_params_, flat_grads_;
  DType compute_dtype_ = DType::kF32;
  Tensor flat_compute_;               // bf16 copies of flat_params_ (mixed precision, params held)
  std::vector<char> stale_;           // per parameter (params_ order): compute needs a recast
  std::unordered_map<const Parameter*, size_t> index_;  // position in params_
  /// Parameters unit u reads: unit_parameters(u), plus the tied embedding for the head.
  std::vector<Parameter*> used_parameters(size_t u) const;
  size_t index_of(const Parameter* p) const;
  int64_t rope_len_ = -1;
  Tensor rope_cos_, rope_sin_;
};

/// The rotary frequencies θ_j = theta^(−2j/Dh), j < Dh/2, with Llama 3.1's scaling of low
/// frequencies (Meta's apply_scaling) when enabled. Returned in fp64.
std::vector<double> rope_frequencies(const ModelArgs& args);

}  // namespace meshtrain
