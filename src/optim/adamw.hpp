#pragma once
/// @file AdamW over the pieces of the parameters this rank updates (all of them when
/// replicated, its dim-0 rows when sharded — parallel/grad_sync.hpp), with the state (exp_avg,
/// exp_avg_sq) of exactly those pieces in flat buffers (kOptimizer), and global-norm gradient
/// clipping.
#include <vector>

#include "config/job_config.hpp"
#include "optim/optimizer.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

class AdamW final : public Optimizer {
 public:
  /// Allocates zeroed state for every shard of `shards` (which must outlive the optimizer).
  /// Weight decay (cfg.weight_decay) applies to matrices; norms and embeddings are exempt
  /// unless decay_embeddings_and_norms.
  AdamW(const std::vector<LocalShard>& shards, Device& dev, const OptimizerSection& cfg);
  /// The optimizer keeps a reference to `shards`: a temporary would dangle, so it does not compile.
  AdamW(std::vector<LocalShard>&& shards, Device& dev, const OptimizerSection& cfg) = delete;
  const std::string& name() const override;
  /// One update with learning rate `lr` (already scheduled), gradients read times `grad_scale`
  /// (clip_coefficient), as one multi-tensor pass (Device::adamw_multi) that also writes the
  /// compute copies given to write_compute_copies; increments the step count t.
  void step(float lr, float grad_scale) override;
  /// Keeps `copies` (one per shard, undefined where none) for every later step. Returns true.
  /// @throws std::invalid_argument as Optimizer::write_compute_copies.
  bool write_compute_copies(const std::vector<Tensor>& copies) override;
  int64_t step_count() const override { return t_; }
  /// Restores the step count t of a checkpoint (bias corrections continue from it).
  void set_step_count(int64_t t) override { t_ = t; }
  /// {"exp_avg", "exp_avg_sq"} for every parameter.
  std::vector<std::string> state_names(const Parameter& p) const override;
  std::vector<Tensor> state_of(size_t shard) const override;
  /// State buffers [Σ align16(shard elements)]; the state of shard i starts at offset(i).
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  int64_t offset(size_t shard) const { return offsets_.at(shard); }

 private:
  const std::vector<LocalShard>& shards_;
  Device& dev_;
  OptimizerSection cfg_;
  std::vector<int64_t> offsets_;
  Tensor m_, v_;
  std::vector<Tensor> compute_;  // per shard: the bf16 compute copy written by step, or undefined
  int64_t t_ = 0;
};

/// Global L2 norm of all gradients, sqrt(Σ g²) over every parameter once (fp64 sum; the
/// strategy reduces over the ranks holding disjoint shards, then the sum over `tp` adds the
/// tensor-parallel slabs and counts replicated parameters once). `each` receives this rank's
/// unreduced Σ g² per local shard (GradientSync::grad_sum_squares). With pipeline parallelism
/// the sum over `pp` adds the stages (a tied copy is not counted: local_sum_squares), so every
/// stage clips with the same norm. Collective for sharded strategies, over tp and over pp.
/// @throws CommError.
double grad_norm(Device& dev, GradientSync& sync, Communicator* tp = nullptr, std::vector<double>* each = nullptr,
                 Communicator* pp = nullptr);

/// Global-norm gradient clipping's coefficient (Pascanu et al. 2013, as
/// torch.nn.utils.clip_grad_norm_): min(1, max_norm / (norm + 1e-6)) for the global L2 `norm`
/// (grad_norm); 1 when max_norm <= 0 (clipping off). The optimizer applies it as it reads the
/// gradients (Optimizer::step's grad_scale). Throws nothing.
double clip_coefficient(double norm, double max_norm);

}  // namespace meshtrain
