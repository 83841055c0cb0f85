#pragma once
/// @file AdamW over a model's parameters, with its state (exp_avg, exp_avg_sq) in flat buffers
/// of the parameters' layout (kOptimizer), and global-norm gradient clipping.
#include "config/job_config.hpp"
#include "model/transformer.hpp"

namespace meshtrain {

class AdamW {
 public:
  /// Allocates zeroed state for every parameter of `model`. Weight decay applies to matrices;
  /// norms and embeddings are exempt unless decay_embeddings_and_norms.
  AdamW(Transformer& model, Device& dev, const OptimizerSection& cfg);
  /// One update with learning rate `lr` (already scheduled); increments the step count t.
  void step(float lr);
  int64_t step_count() const { return t_; }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }

 private:
  Transformer& model_;
  Device& dev_;
  OptimizerSection cfg_;
  Tensor m_, v_;
  int64_t t_ = 0;
};

/// Global L2 norm of all gradients, sqrt(Σ g²) over every parameter once (fp64 sum). With
/// unsharded, replicated gradients every rank computes the same value locally.
double grad_norm(Device& dev, const Transformer& model);

/// Scales all gradients by min(1, max_norm / (norm + 1e-6)) (Pascanu et al. 2013), as
/// torch.nn.utils.clip_grad_norm_. No-op when max_norm <= 0. Returns the scale applied.
double clip_grad_norm(Device& dev, const Transformer& model, double norm, double max_norm);

}  // namespace meshtrain
