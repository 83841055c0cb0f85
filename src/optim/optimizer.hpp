#pragma once
/// @file Optimizer: what the trainer and the checkpoints need of an optimizer over the pieces of
/// the parameters this rank updates (GradientSync::local_shards()): one step per training step,
/// a step count to resume from, and the state tensors kept per parameter element, named as
/// PyTorch's optimizers name them (AdamW: exp_avg, exp_avg_sq; Muon: momentum_buffer), which
/// checkpoints store under /optimizer/<parameter>/<state name> in the parameter's global shape.
/// Implementations: AdamW (optim/adamw.hpp) and Muon (optim/muon.hpp).
#include <cstdint>
#include <string>
#include <vector>

#include "model/parameter.hpp"
#include "tensor/tensor.hpp"

namespace meshtrain {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// "AdamW" or "Muon" ([optimizer] name), recorded in checkpoints: resuming under another
  /// optimizer is refused (the state means something else).
  virtual const std::string& name() const = 0;
  /// One update of every local shard with the scheduled learning rate `lr` of the step. The
  /// gradients are final (reduced) and are read times `grad_scale`, global-norm clipping's
  /// coefficient (clip_coefficient, optim/adamw.hpp; 1 = as they are): the same values as
  /// scaling them first, without a pass over them. Collective for optimizers that exchange
  /// parameters (Muon under FSDP or tp). @throws CommError.
  virtual void step(float lr, float grad_scale) = 0;
  /// Asks the optimizer to write, in each later step, local shard i's updated values rounded to
  /// nearest even into copies[i] (bf16, the shard's numel; undefined: none): the mixed-precision
  /// compute copies, produced by the update's own pass instead of a cast pass that reads the
  /// master weights again. Returns whether it will; false (this default, and Muon, whose
  /// matrices' updates come back from an exchange) leaves the copies to the caller and checks
  /// nothing. An optimizer that accepts throws std::invalid_argument when copies does not have
  /// one entry per shard or an entry is not bf16 of its shard's numel.
  virtual bool write_compute_copies(const std::vector<Tensor>& copies) {
    (void)copies;
    return false;
  }
  /// Steps taken (AdamW's t, which its bias corrections use); restored on resume.
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t t) = 0;
  /// The names of the state tensors kept for parameter `p`, each of p's global shape, the same
  /// on every rank (a checkpoint creates every dataset on every rank, also for parameters held
  /// elsewhere). Works on catalog entries (shape and name only). Throws nothing.
  virtual std::vector<std::string> state_names(const Parameter& p) const = 0;
  /// Flat [n] views (n = the local shard's elements) of local shard `shard`'s state, in the
  /// order of state_names(*shard.param). @throws std::out_of_range for a bad index.
  virtual std::vector<Tensor> state_of(size_t shard) const = 0;
};

}  // namespace meshtrain
