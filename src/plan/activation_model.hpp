#pragma once
/// @file Activation memory of one rank, derived from the layer code rather than from a
/// textbook figure. Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
/// Transformer Models", eq. 2) give 34·s·b·h + 5·a·s²·b bytes per layer for GPT-3's layer (GELU,
/// dropout masks, stored attention scores); meshtrain's blocks keep other tensors (SwiGLU's two
/// projections, grouped-query K/V, flash attention's log-sum-exp instead of the scores, no
/// dropout), so that figure does not apply. Instead this file replays, allocation by allocation,
/// what model/layers/*.cpp and graph/executor.cpp allocate in the activations category during
/// one micro-batch's forward and backward — which tensors each layer saves, which temporaries
/// live until a function returns, what tensor and sequence parallelism gather — and reports
/// the high-water mark of bytes alive, as the caching allocator counts them (requested bytes).
///
/// Symbols (per micro-batch on one rank): b samples, T = seq_len / cp tokens per sample, N = b·T
/// tokens, n = N / tp under sequence parallelism (else N), D = dim, Q = (Hq/tp)·Dh,
/// K = (Hkv/tp)·Dh, F = ffn_dim / tp, V = vocab / tp, β = bytes of the activation dtype
/// (4 on the cpu backend, 2 under bf16), floats 4 bytes. A dense block saves
///   β·(n·D [input] + N·D [attention input] + 2·N·Q + 2·N·K + n·D [residual h] + N·D [FFN
///   input] + 3·N·F) + 4·(2·n + N·Hq/tp) [rstd, lse]
/// (+ β·(N·Q + N·K) + 4·N·(Hq + Hkv)/tp with Qwen3's q/k norm). The head saves its input, its
/// normed input and the [N, V] logits, overwritten in place by their gradient. Backward's peak
/// adds the gradients in flight (the FFN's dh, da, db of N·F each, for example).
///
/// Split backwards (zero-bubble schedules' I): the tensors the weight-gradient terms read (each
/// linear's input and output gradient, each norm's input, output gradient and rstd, the
/// embedding's gathered gradient, the experts' rows and the gate's logits gradient) stay alive
/// until W instead of dying with the backward.
///
/// Mixture of Experts blocks replay moe.cpp with R = N·top_k routed rows; with expert
/// parallelism a rank receives R rows on average (balanced routing — a skewed router makes the
/// busiest rank receive more). Context parallelism keeps the same tensors at T = seq_len / cp
/// (ring and all-gather attention save q, k, v, the output and the log-sum-exp; their K/V
/// buffers are in the communication category).
#include <cstdint>
#include <memory>
#include <vector>

#include "config/model_args.hpp"
#include "parallel/pipeline/simulate.hpp"

namespace meshtrain {

/// What one rank runs per micro-batch.
struct ActivationShape {
  ModelArgs args;
  int64_t micro_batch = 1;   ///< b, samples per micro-batch
  int64_t seq_len = 2048;    ///< tokens per sample before the cp cut
  int64_t cp = 1, tp = 1, ep = 1;
  bool sequence_parallel = true;
  int64_t act_bytes = 4;     ///< β: 4 (float32) or 2 (bfloat16)
  /// Activation checkpointing: 0 none, 1 full, N > 1 … selective every N-th block (block % N == 0),
  /// −1 per-operator selective (every block keeps the outputs of its attention, collectives and
  /// every second matmul, and reruns the rest: per_op_stash in activation_model.cpp).
  int64_t recompute_every = 0;
  /// One pipeline stage this rank runs (the whole model without pp).
  struct Stage {
    std::vector<int64_t> blocks;  ///< global block indices, in order
    bool embedding = true;        ///< the embedding (first stage)
    bool head = true;             ///< the norm, output projection and loss (last stage)
  };
  /// Shared and immutable (a planner asks for many shapes over the same split); null means no stage.
  std::shared_ptr<const std::vector<Stage>> stages;
  /// Stage micro-batches whose saved activations this rank holds at once (pipeline schedules:
  /// the simulator's peak in-flight count; 1 without pp). Without `states`, the replay holds
  /// in_flight − 1 of the largest stage's and runs one more through each stage.
  int64_t in_flight = 1;
  /// Pipeline schedules: the rank's undominated in-flight states (SimulationResult::
  /// in_flight_states: per stage, indexed like `stages`, the micro-batches awaiting their
  /// backward and those between I and W, and the stage and phase of the action running). When
  /// given, each state holds its micro-batches' bytes stage by stage — a forward's kept tensors,
  /// or a split backward's weight-gradient operands (what the I replay leaves alive) — while
  /// its action runs: a forward state's forward phases, a backward state's backward phases
  /// (the I replay when any state has a pending W), a W only what is held. in_flight is then
  /// unused.
  std::shared_ptr<const std::vector<SimulationResult::InFlightState>> states;
  /// A number naming `states`' content for the replay's cache of state groups (equal numbers
  /// only for equal contents; the memory model numbers the simulator's lists it caches); 0: none.
  int64_t states_id = 0;
  /// Pipeline parallelism: micro-batches per round, m (0 without pp). The runtime keeps every
  /// started micro-batch's token ids and targets until the round ends and posts one receive
  /// buffer ahead.
  int64_t pp_microbatches = 0;
};

/// The prediction, bytes.
struct ActivationPrediction {
  int64_t peak = 0;             ///< high-water mark of the activations category
  int64_t per_microbatch = 0;   ///< bytes one micro-batch keeps from its forward to its backward (largest stage)
  int64_t per_microbatch_rank = 0;  ///< the same summed over the rank's stages (one micro-batch through all of them)
  int64_t persistent = 0;       ///< RoPE tables (float32 [T, Dh/2] cos and sin), kept across steps
  int64_t after_step = 0;       ///< bytes alive once the step's backwards are done (the gradient syncs' time)
  /// The highest bytes alive during each unit's forward and during its backward (recomputation
  /// included), units in forward order (embedding, blocks, head of the stage that peaks), so a
  /// caller can add what other categories hold during the same unit.
  std::vector<int64_t> forward_by_unit, backward_by_unit;
  std::vector<int64_t> after_backward_by_unit;  ///< bytes alive when each unit's backward has returned
  size_t stage = 0;  ///< the index in ActivationShape::stages of the stage that peaks
  /// Pipeline schedules (ActivationShape::states given): the same phase arrays per running stage
  /// and set of the rank's stages that have run a backward (InFlightState::backed), each the
  /// highest over the states of that kind — so a caller can add what those backwards left
  /// alive (pipelined FSDP's unsharded gradients). The fields above are those of the group
  /// that peaks.
  struct Group {
    size_t stage = 0;
    std::vector<char> backed;
    std::vector<int64_t> forward_by_unit, backward_by_unit, after_backward_by_unit;
  };
  std::vector<Group> groups;
};

/// Replays one training micro-batch (and in_flight − 1 more held) on one rank. The result is
/// shared and immutable (the memory model caches it per rank shape).
/// @throws std::invalid_argument for a shape that does not split (tp, cp, ep) or no work.
std::shared_ptr<const ActivationPrediction> predict_activations(const ActivationShape& shape);

}  // namespace meshtrain
