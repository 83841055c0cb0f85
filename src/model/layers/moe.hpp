#pragma once
/// @file MoE: the Mixture-of-Experts feed-forward of a transformer block (Shazeer et al. 2017;
/// the dropless token-choice form of Gale et al. 2023, MegaBlocks; the router rules of
/// DeepSeek-V3, Liu et al. 2024, and Qwen3-MoE; TorchTitan's moe.py for names).
///
/// Per micro-batch, for this rank's N token rows x [N, D]:
///   1. Router: logits f32 [N, E] = x · gateᵀ; scores = softmax or sigmoid (f32); each token
///      takes the top_k experts of scores + expert_bias (the bias only chooses); its gates are
///      the unbiased scores of those experts, renormalized (route_norm) and scaled (route_scale).
///   2. Dispatch: the N·k (token, choice) pairs sorted by expert, stably (plan_dispatch), and
///      the rows gathered into xs [R = N·k, D]. Dropless: no capacity, every pair is computed.
///   3. Experts: per expert e, on its rows, y = w2_e(silu(w1_e·x) ⊙ w3_e·x) — three grouped
///      GEMMs (Device::grouped_matmul) over xs.
///   4. Combine: out[n] = Σ_j gate[n, j] · y[row of (n, j)], plus the shared experts (a dense
///      SwiGLU FFN every token runs through) when num_shared_experts > 0.
///
/// Load balancing:
///   - auxiliary-loss-free (DeepSeek-V3 §2.1.2, Wang et al. 2024): once per optimizer step the
///     trainer moves expert_bias by load_balance_coeff · sign(mean load − load), with the loads
///     counted over every rank (update_expert_bias). Like TorchTitan we then subtract the
///     update's mean, so the bias stays centred; selection is unchanged by a common shift;
///   - sequence-wise balance loss (DeepSeek-V3 eq. 17-20), coefficient α = aux_loss_coeff:
///     α · Σ_e f_e·P_e per sequence with f_e = E/(k·T) · (tokens of the sequence choosing e),
///     P_e = mean over the sequence of s'_e (the scores normalized to sum 1), averaged over the
///     step's sequences. A sequence cut over cp ranks (and tp ranks under sequence
///     parallelism) sums its statistics over them first, so every layout computes the same loss;
///   - router z-loss (Zoph et al. 2022, ST-MoE eq. 5), β = z_loss_coeff: β · mean over the
///     step's tokens of logsumexp(logits)².
/// Both losses are added to the objective; their gradients flow into the router only.
///
/// Tensor parallelism: routed experts and the router are whole on every tp rank. Under sequence
/// parallelism each tp rank routes its own token shard (their gradients are then partial over
/// tp, summed after backward like the norms'); without it every tp rank computes all tokens.
/// The shared experts are tensor-parallel like the dense FFN.
///
/// Expert parallelism (ep > 1): each ep rank holds E/ep experts; after the dispatch sort the
/// rows go to their experts' ranks by all_to_all_v (the per-expert counts first, by all_to_all),
/// are permuted to (local expert, source) order for the grouped GEMMs, and return the same way
/// before the combine (moe_exchange.hpp). Backward exchanges the gradients along the same paths.
///
/// Per-operator activation checkpointing (SavedTensors::op) keeps the outputs of the ep
/// all-to-alls and of the shared experts' kept matmuls; the router's gate matmul (TorchTitan
/// forces its recomputation: per_op_sac_force_recompute_mm_shapes_by_fqns = ["moe.router.gate"],
/// not counted) and the experts' grouped GEMMs (torch._grouped_mm is not on TorchTitan's save
/// list) are recomputed.
///
/// Saved per micro-batch (SavedTensors, in push order): x, logits, scores, topk, gates, rows,
/// xe (the experts' input rows), a, b, h, y; with ep the received counts and both permutations;
/// with the balance loss sample ids and coefficients. The host copy of the routing is rebuilt
/// in backward from the saved topk (one download).
#include <memory>
#include <vector>

#include "model/expert_parallel.hpp"
#include "model/layers/feed_forward.hpp"
#include "model/layers/moe_exchange.hpp"

namespace meshtrain {

/// One MoE layer's routing statistics over the current optimizer step on this rank, for the
/// bias update and the metrics. Token counts are 0 on a tp rank whose tokens another tp rank
/// also counts (no sequence parallelism), so a sum over all ranks counts each token once.
struct MoeStepStats {
  std::vector<double> tokens_per_expert;  ///< [E] (token, choice) pairs routed to each expert
  double aux_loss = 0;  ///< this rank's share of the balance loss (already over the global batch)
  double z_loss = 0;    ///< this rank's share of the z-loss (already over the global tokens)
  double dispatch_s = 0;  ///< seconds this rank spent in the ep token exchange (counts and rows, both ways)
};

/// forward: [N, D] → [N, D], N per tp_local_tokens. Weights: router.gate.weight [E, D];
/// experts.w1, experts.w3 [E, H, D] and experts.w2 [E, D, H] (H = moe_inter_dim, the expert
/// dimension first, as TorchTitan's GroupedExperts); shared_experts.w{1,2,3}.weight as a
/// FeedForward of hidden num_shared_experts·H. Buffer: expert_bias f32 [E].
class MoE final : public Layer {
 public:
  /// `ep`: the expert-parallel group; this rank holds experts [ep.rank·E/ep, (ep.rank+1)·E/ep)
  /// of experts.w1/w2/w3 and exchanges tokens with the group (moe_exchange.hpp).
  /// @throws std::invalid_argument when args has no experts, top_k is outside [1, E], or ep
  /// does not divide E.
  MoE(const ModelArgs& args, int layer_id, const std::string& prefix, const TensorParallel& tp,
      const ExpertParallel& ep = {});
  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  /// Training forwards (ctx.need_backward) that keep their activations (not the discarded
  /// first pass of activation checkpointing, whose recomputation counts instead) add their
  /// routing to step_stats(), so every micro-batch is counted exactly once.
  /// @throws std::out_of_range when a routing index is corrupt; CommError (balance loss
  /// statistics over cp / tp).
  Tensor forward(StepContext& ctx, SavedTensors& saved, const Tensor& x) override;
  Tensor backward(StepContext& ctx, SavedTensors& saved, const Tensor& dout) override;

  int64_t num_experts() const { return e_; }
  /// The global index of the block holding this layer.
  int layer_id() const { return layer_id_; }
  /// The selection bias [E] (host copy; the device copy follows it).
  const std::vector<float>& expert_bias() const { return bias_; }
  /// Replaces the bias (checkpoint load). @throws std::invalid_argument for a wrong length.
  void set_expert_bias(std::vector<float> bias);
  MoeStepStats& step_stats() { return stats_; }
  /// Clears step_stats() (after the optimizer step).
  void clear_step_stats();

  Parameter gate, w1, w2, w3;

 private:
  /// One micro-batch's expert-parallel exchange: the plan and its device copies.
  struct ExchangeState {
    EpExchange plan;
    Tensor recv_counts;     ///< i32 [E]: counts received per (source, local expert)
    Tensor perm, inv_perm;  ///< i32 [rows_in]
  };
  /// Exchanges the per-expert counts over ctx.ep (an all-to-all whose output per-op
  /// checkpointing keeps in `saved`) and plans the rows' exchange. @throws std::logic_error when
  /// ctx.ep is not the group the weights were split for; CommError.
  ExchangeState start_exchange(StepContext& ctx, SavedTensors& saved, const std::vector<int64_t>& counts);
  /// to_experts: this rank's expert-sorted rows [R, D] → the experts' rows [rows_in, D] in
  /// (local expert, source) order; else the reverse. Blocking; its time goes to
  /// step_stats().dispatch_s. @throws CommError.
  Tensor exchange_rows(StepContext& ctx, const ExchangeState& ex, const Tensor& rows, bool to_experts);

  std::string name_;
  int layer_id_;
  int64_t e_, k_, dim_, hidden_;
  MoeRouting routing_;
  double aux_coeff_, z_coeff_;
  std::unique_ptr<FeedForward> shared_;
  std::vector<float> bias_;
  Tensor bias_dev_;        // device copy of bias_, uploaded when stale
  bool bias_stale_ = true;
  MoeStepStats stats_;
  bool partial_over_tp_;   // sequence parallel tp: each tp rank routes its own token shard
  int64_t ep_size_ = 1;    // the ep degree the weights were split for (ctx.ep must match)
};

/// The auxiliary-loss-free bias step of one layer (DeepSeek-V3 §2.1.2, as TorchTitan applies
/// it): delta_e = coeff · sign(mean(load) − load_e), then delta −= mean(delta); bias += delta.
/// load [E] tokens per expert over the whole step and every rank. Returns the new bias.
/// @throws std::invalid_argument when the lengths differ.
std::vector<float> update_expert_bias(const std::vector<float>& bias, const std::vector<double>& load, double coeff);

}  // namespace meshtrain
