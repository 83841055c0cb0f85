#pragma once
/// @file ShardedDataParallel: ZeRO stages 1–3 over the fsdp group (dp_shard × cp), optionally
/// replicated over dp_replicate (HSDP) — Rajbhandari et al. 2020 (ZeRO), Zhao et al. 2023
/// (PyTorch FSDP), with FSDP2's per-parameter dim-0 sharding (DESIGN.md data flow steps 5, 6, 8).
///
/// Per sharding unit (shard_plan.hpp) every rank keeps the reduced gradient shard [S] and the
/// AdamW state of its rows; ZeRO-3 also keeps only its parameter shard [S] and gathers the
/// unit's parameters into one flat buffer before the unit runs:
///  - forward: all-gather before the unit (the next unit's all-gather is issued before this
///    unit computes: prefetch), free after it when resharding after forward (never the last
///    unit, whose backward follows at once);
///  - backward: all-gather again (prefetching the previous unit), then after the unit's
///    backward reduce-scatter its unsharded gradients into the shard and free both (under
///    reduce_once_per_step, pipeline parallelism: both stay until the step's last backward);
///  - ZeRO-2 reduce-scatters every micro-batch too but keeps replicated parameters, refreshed by
///    an all-gather of the updated shards after the optimizer step; ZeRO-1 keeps replicated
///    gradients as well and reduce-scatters once, after the last micro-batch;
///  - HSDP: once a unit's last reduce-scatter of the step completes, its gradient shard is
///    all-reduced (sum) over dp_replicate.
/// Collectives are non-blocking, issued in the same order on every rank, and waited for only
/// where their result is used; completed ones are retired in issue order at every hook.
/// Memory categories: shards are kParameters / kGradients / kOptimizer; unsharded parameters
/// and gradients of the units in flight and the collectives' staging buffers are
/// kCommunication (all served from the device's caching allocator, so steady-state steps reuse
/// the same blocks).
#include <deque>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "model/transformer.hpp"
#include "parallel/fsdp/shard_plan.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

struct ShardedOptions {
  int zero_stage = 3;                ///< 1, 2 or 3
  bool reshard_after_forward = true; ///< ZeRO-3 only
  /// dtype on the wire of the gradient reduce-scatter and the HSDP all-reduce (FSDP2's
  /// reduce_dtype): f32, or bf16 (cast before, summed in bf16, widened into the f32 shard).
  DType reduce_dtype = DType::kF32;
  /// ZeRO-3: dtype of the parameter all-gather (FSDP2's param_dtype). bf16: each rank casts its
  /// f32 shard and the gathered bf16 values become the units' Parameter::compute directly (half
  /// the bytes of an f32 gather); gather_full_parameters() still gathers f32 for dumps.
  DType param_dtype = DType::kF32;
  /// ZeRO-2/3: keep each unit's unsharded gradients over all micro-batches of the step and
  /// reduce-scatter them once, after the unit's last backward (TorchTitan's FSDP under pipeline
  /// parallelism). Costs a stage's unsharded gradients in memory, saves m − 1 reduce-scatters
  /// per unit, and lets zero-bubble schedules defer weight gradients of several micro-batches.
  /// ZeRO-3 then also keeps a unit's gathered parameters from its first all-gather of the step
  /// until its last backward (FSDP2's reshard_after_backward only on the last micro-batch, as
  /// PyTorch's pipeline stages set it): one all-gather per unit and step, whatever order the
  /// schedule runs micro-batches in, instead of one per backward.
  bool reduce_once_per_step = false;
  /// The parameters this instance shards (empty: all). Expert parallelism runs two instances:
  /// the routed experts over efsdp, everything else over fsdp (ComposedGradientSync).
  ParamFilter select = {};
  /// A further group over which this instance's squared gradient norm is summed: ep for the
  /// experts' instance, whose shard group (efsdp) holds only this rank's experts.
  Communicator* norm_group = nullptr;
  /// HSDP: issue the all-reduces over dp_replicate only in finish_gradients(), in unit order,
  /// instead of as each reduce-scatter retires. A second instance sharing the dp_replicate
  /// communicator needs it: collectives on one communicator must be issued in the same order
  /// on every rank, and retirement times differ between ranks.
  bool replicate_at_finish = false;
  /// ZeRO-3: all-gather the weights of linears converted to Float8 under the tensorwise recipe
  /// in e4m3 bytes (TorchTitan's [quantize.linear.float8] enable_fsdp_float8_all_gather, TorchAO's
  /// float8 FSDP all-gather, torchao/float8/fsdp_utils.py): the unit's local amax of each such
  /// weight's f32 shard, one all-reduce (max) of them over the shard group (and over the weight's
  /// float8_tp group: TorchAO's amax is the whole DTensor's) — TorchAO's
  /// precompute_float8_dynamic_scale_for_fsdp batching — each rank's shard cast to e4m3 codes
  /// with that amax, an all-gather of the codes (1 byte per element instead of 2 or 4), and the
  /// codes dequantized into the weights' full copies in param_dtype. The forward and backward
  /// casts of those copies give back the same codes (see ensure_params), so a run equals the
  /// high-precision gather's bit for bit when param_dtype is f32. The unit's other parameters
  /// (norms) go through a second all-gather in param_dtype; gradients are unchanged.
  bool float8_all_gather = false;
};

/// The model storage a ZeRO stage needs the Transformer to allocate itself: replicated
/// parameters below stage 3, replicated gradients below stage 2.
ModelStorage model_storage_for(int zero_stage);

class ShardedDataParallel final : public GradientSync {
 public:
  /// `model` must have been built with model_storage_for(opt.zero_stage). `shard` is the fsdp
  /// communicator; `replicate` the dp_replicate one (nullptr or size 1: no HSDP).
  /// @throws std::invalid_argument for a zero_stage outside 1..3 or a model with the wrong storage.
  ShardedDataParallel(Transformer& model, Device& dev, Communicator& shard, Communicator* replicate,
                      ShardedOptions opt);
  ~ShardedDataParallel() override;

  /// Layout-independent initialization of what this rank holds (model/init.hpp): ZeRO-3 fills
  /// its parameter shards with elements [first_row·C, …) of each parameter; ZeRO-1/2 the
  /// replicated parameters.
  void init_weights(uint64_t seed);
  const ShardPlan& plan() const { return plan_; }

  void pre_forward(size_t unit, int64_t mb) override;
  void post_forward(size_t unit, int64_t mb) override;
  void pre_backward(size_t unit, int64_t mb) override;
  void post_backward(size_t unit, int64_t mb) override;

  void set_micro_batch_role(bool first, bool last) override;
  void begin_evaluation() override;
  void finish_gradients() override;
  const std::vector<LocalShard>& local_shards() const override { return shards_; }
  /// Σ g² over this rank's gradient rows, summed over the shard group (replicas hold equal
  /// shards) and ShardedOptions::norm_group.
  double grad_sum_squares(Device& dev, std::vector<double>* each = nullptr) override;
  void after_optimizer_step() override;
  void gather_full_parameters() override;
  void release_full_parameters() override;
  double take_comm_wait_seconds() override;
  bool forward_is_collective() const override { return true; }

 private:
  struct UnitState {
    Tensor shard_values;  // ZeRO-3: [S] kParameters
    Tensor shard_grads;   // [S] kGradients: the reduced gradient shard of the step
    Tensor full_values;   // ZeRO-3, while gathered: [F] kCommunication
    Tensor full_grads;    // ZeRO-2/3, during the unit's backward: [F] kCommunication
    bool params_ready = false;  // Parameter::value holds the current full values
    Tensor gather_send, gather_recv;
    std::unique_ptr<Work> gather;  // in-flight all-gather (declared after its buffers: destroyed first)
    // float8_all_gather: the amax [number of Float8 weights] (reduced), and the e4m3 codes sent
    // and received (i32 elements of 4 codes each)
    Tensor f8_amax, f8_send, f8_recv;
    std::unique_ptr<Work> f8_gather;
  };
  // float8_all_gather's split of a unit: its Float8 weights (offsets of the byte layout, one
  // code per element, 16-aligned: i32 views start on whole elements) and its other parameters
  // (offsets of their own high-precision layout); shard_offset / shard_elems in those layouts.
  struct Float8Split {
    ShardUnit f8, hp;
    std::vector<int64_t> f8_master_offset, hp_master_offset;  // into shard_values
    Communicator* tp = nullptr;  // the Float8 weights' float8_tp group, if split over tp
  };
  struct Reduction {
    size_t unit = 0;
    bool last = false;   // last micro-batch: all-reduce over dp_replicate afterwards
    Tensor in, staging;  // staging: reduce-scatter output to add into shard_grads (accumulation)
    Tensor wire_out;     // bf16 reduce: the reduce-scatter's bf16 output, widened on retirement
    bool accumulate = false;  // bf16 reduce: add wire_out into shard_grads (else overwrite)
    std::unique_ptr<Work> work;
  };
  struct ReplicaReduction {  // HSDP all-reduce of one unit's gradient shard
    Tensor wire;             // bf16 reduce: the bf16 copy reduced in place, then widened into target
    Tensor target;
    std::unique_ptr<Work> work;
  };
  bool wire_bf16() const { return opt_.reduce_dtype == DType::kBF16; }

  bool shards_params() const { return opt_.zero_stage >= 3; }
  /// ZeRO-3 with bf16 gathers, outside gather_full_parameters().
  bool gather_bf16() const { return shards_params() && opt_.param_dtype == DType::kBF16 && !full_precision_; }
  bool shards_grads() const { return opt_.zero_stage >= 2; }
  /// Whether unit f's gathers for compute go through the Float8 split (outside
  /// gather_full_parameters()).
  bool gather_f8(size_t f) const { return !full_precision_ && !f8_split_[f].f8.params.empty(); }
  void start_f8_gather(size_t f);
  void finish_f8_gather(size_t f);
  void start_gather(size_t f);
  void ensure_params(size_t f);
  void release_params(size_t f);
  void start_reduce(size_t f);
  void retire(bool block);  // retires completed reductions in issue order (all when block)
  void poll() { retire(false); }
  void timed_wait(Work& w);

  Transformer& model_;
  Device& dev_;
  Communicator& shard_;
  Communicator* replicate_;
  ShardedOptions opt_;
  ShardPlan plan_;
  std::vector<UnitState> units_;
  std::vector<Float8Split> f8_split_;  // per unit; empty splits without float8_all_gather
  std::vector<LocalShard> shards_;
  std::deque<Reduction> reductions_;            // reduce-scatters, in issue order
  std::deque<ReplicaReduction> replicas_;        // HSDP all-reduces, in issue order
  std::vector<size_t> pending_replicas_;         // replicate_at_finish: units whose all-reduce waits
  void start_replica(size_t f);
  bool first_ = true, last_ = true;  // set_micro_batch_role's role of the current backward
  bool eval_ = false;
  bool full_precision_ = false;  // gather_full_parameters(): f32 values, whatever param_dtype
  double wait_s_ = 0;
};

}  // namespace meshtrain
