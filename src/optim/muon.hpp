#pragma once
/// @file Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"),
/// distributed over every parallel dimension, with AdamW for the parameters it does not treat.
///
/// For each weight matrix W [m, n] (muon_orthogonalizes: attention, FFN, router, each routed
/// expert) with gradient G, per step (PyTorch's torch.optim.Muon and Megatron-Core's forms):
///
///     M ← μ·M + (1 − μ)·G                      momentum_buffer (muon_momentum μ, default 0.95)
///     U = (1 − μ)·G + μ·M   (Nesterov; else U = M)
///     O = NewtonSchulz₅(U)                      optim/newton_schulz.hpp (muon_num_ns_steps)
///     W ← W·(1 − lr·λ) − lr·s(m, n)·O           decoupled weight decay λ (weight_decay)
///
/// with the update scale s (muon_scale_mode × muon_extra_scale_factor): "spectral" √max(m, n)
/// (with the factor 0.2 this is Moonlight's rule, Liu et al. 2025, "Muon is Scalable for LLM
/// Training", eq. 4, which gives the update AdamW's RMS so that AdamW's lr and weight decay carry
/// over), "shape_scaling" √max(1, m/n) (Jordan et al.), "unit_rms_norm" √(m/n).
/// The token embedding, the output head and the norms stay on AdamW (optim/adamw.hpp) with
/// adamw_lr / adamw_weight_decay (default: lr / weight_decay) and beta1, beta2, eps; the
/// schedule scales both groups' rates alike.
///
/// Distribution (optim/muon_plan.hpp): the momentum stays sharded like the gradients; U is
/// gathered to each matrix's owner over the shard group and tp, orthogonalized there, and O
/// scattered back, with two uneven all-to-alls over each shard group and two over tp per step.
/// Under pipeline parallelism each stage does its own matrices.
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "config/job_config.hpp"
#include "optim/adamw.hpp"
#include "optim/muon_plan.hpp"
#include "optim/optimizer.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

/// The communicators Muon exchanges matrices over. shard_group(p) is the group whose ranks hold
/// disjoint dim-0 rows of p's tp-local tensor (fsdp, or efsdp for routed experts), or nullptr
/// when p is held whole (DDP, replicated); tp is the tensor-parallel group (nullptr: tp = 1).
struct MuonComms {
  std::function<Communicator*(const Parameter&)> shard_group;
  Communicator* tp = nullptr;
};

class Muon final : public Optimizer {
 public:
  /// Splits `shards` (which must outlive the optimizer) into Muon matrices and AdamW parameters,
  /// allocates zeroed momentum (f32, kOptimizer) and the AdamW state, and plans the matrix
  /// exchange (collective-free: every rank derives the same plan from the shapes).
  /// @throws std::invalid_argument for a shard that is not the dim-0 rows its group implies,
  /// or a tp layout Muon cannot orthogonalize (the deck's keys were range-checked by its validation).
  Muon(const std::vector<LocalShard>& shards, Device& dev, const OptimizerSection& cfg, MuonComms comms);
  /// The optimizer keeps a reference to `shards`: a temporary would dangle, so it does not compile.
  Muon(std::vector<LocalShard>&& shards, Device& dev, const OptimizerSection& cfg, MuonComms comms) = delete;
  ~Muon() override;
  const std::string& name() const override;
  /// One Muon + AdamW update at the scheduled `lr` (see the file comment), gradients times
  /// `grad_scale` (the AdamW group reads them scaled; the Muon matrices' gradients are scaled in
  /// place first, as clipping did). Collective over the shard groups and tp when they have more
  /// than one rank. @throws CommError.
  void step(float lr, float grad_scale) override;
  int64_t step_count() const override { return t_; }
  void set_step_count(int64_t t) override;
  /// {"momentum_buffer"} for Muon matrices, AdamW's {"exp_avg", "exp_avg_sq"} otherwise.
  std::vector<std::string> state_names(const Parameter& p) const override;
  std::vector<Tensor> state_of(size_t shard) const override;
  /// The matrices and their owners (for tests and the planner's checks).
  const std::vector<MuonMatrix>& matrices() const { return matrices_; }
  /// Newton–Schulz flops this rank ran in its last step.
  double last_step_flops() const { return last_flops_; }

 private:
  struct Exchange;

  const std::vector<LocalShard>& shards_;
  Device& dev_;
  OptimizerSection cfg_;
  MuonComms comms_;
  std::vector<LocalShard> adam_shards_;  ///< the AdamW group (declared before adam_, which refers to it)
  std::vector<int64_t> adam_index_;      ///< shard index -> index in adam_shards_, or -1
  std::unique_ptr<AdamW> adam_;
  std::vector<int64_t> mom_offset_;      ///< shard index -> offset in mom_, or -1 (AdamW shard)
  Tensor mom_;
  int64_t mom_elems_ = 0;
  std::vector<MuonMatrix> matrices_;
  std::unique_ptr<Exchange> ex_;
  int64_t t_ = 0;
  double last_flops_ = 0;
};

}  // namespace meshtrain
