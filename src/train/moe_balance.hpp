#pragma once
/// @file Step-end bookkeeping of Mixture-of-Experts layers: their routing statistics summed over
/// every rank, the auxiliary-loss-free bias update (DeepSeek-V3 §2.1.2), and the step's MoE
/// metrics. Each rank holds the MoE layers of its model part (pipeline stages hold different
/// ones); the statistics travel in one buffer indexed by the model's global MoE layer order.
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "config/model_args.hpp"
#include "model/layers/moe.hpp"

namespace meshtrain {

/// The step's MoE statistics over all ranks.
struct MoeStepMetrics {
  std::vector<int64_t> layers;                          ///< global block index of each MoE layer
  std::vector<std::vector<double>> tokens_per_expert;   ///< [MoE layers][E] routed (token, choice) pairs
  std::vector<float> bias_min, bias_max;                ///< [MoE layers] expert_bias range after the update
  double aux_loss = 0;  ///< balance loss of the step (summed over layers; 0 when off)
  double z_loss = 0;    ///< z-loss of the step (summed over layers; 0 when off)
  double dispatch_s = 0;  ///< seconds in the ep token exchange, mean over ranks (0 without ep)
  /// Per layer min, max and coefficient of variation (std / mean, population) of the loads.
  struct Summary {
    double min = 0, max = 0, cv = 0;
  };
  Summary summary(size_t layer) const;
  /// The layer with the largest max/mean load and that ratio ({-1, 0} without MoE layers).
  std::pair<int64_t, double> worst_imbalance() const;
};

/// Collective over `world`: sums every rank's MoE step statistics (each token counted once:
/// MoE::step_stats), then, when `update_bias` (an applied step) and load_balance_coeff > 0,
/// moves each held layer's expert_bias by update_expert_bias with the global loads — the same
/// values on every rank holding the layer. Clears the held layers' statistics.
/// `held` are this rank's MoE layers (Transformer::moe_layers). @throws CommError.
MoeStepMetrics finish_moe_step(const ModelArgs& args, const std::vector<MoE*>& held, Communicator& world,
                               bool update_bias);

/// Every MoE block's expert_bias on every rank, in block order (what checkpoints store):
/// collective over `world` (a max-reduction from the ranks holding each layer; its replicas are
/// equal). Empty for a dense model. @throws CommError.
std::vector<std::vector<float>> gather_expert_biases(const ModelArgs& args, const std::vector<MoE*>& held,
                                                     Communicator& world);

/// Sets each held layer's bias from `biases` (block order, as gather_expert_biases returns).
/// @throws std::invalid_argument when the count or a length does not match the model.
void restore_expert_biases(const ModelArgs& args, const std::vector<MoE*>& held,
                           const std::vector<std::vector<float>>& biases);

}  // namespace meshtrain
