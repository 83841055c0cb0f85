#pragma once
/// @file Trainer: wires config, communicators, device, model, executor, data parallelism,
/// optimizer, data, checkpoints and metrics together (DESIGN.md data flow steps 5–9).
///
/// Life of a run, one method each:
///  - build (the constructor): communicators and the ParallelContext, the device, the model and
///    its data-parallel strategy (DDP, ZeRO-1/2, FSDP, HSDP), executor, optimizer, LR schedule,
///    the step schedule; then the resume from `latest` and the run outputs (metrics.jsonl,
///    TensorBoard, traces);
///  - train_step: one optimizer step (the schedule's micro-batches, the reductions, the
///    non-finite check agreed over the world, clipping and the optimizer, AdamW or Muon);
///  - validate: the validation loss, forward only;
///  - save: a sharded checkpoint, published atomically (or staged and written in the background:
///    [checkpoint] async_mode);
///  - finalize: the final model (sharded, model only) and the summary.
/// train() runs them in order, with metrics, validation, checkpoints and preemption at step
/// boundaries.
#include <array>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/async_checkpoint.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "comm/mesh_communicators.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "config/job_config.hpp"
#include "config/pipeline_plan.hpp"
#include "data/loader.hpp"
#include "data/token_store.hpp"
#include "device/device.hpp"
#include "graph/executor.hpp"
#include "layout/rank_layout.hpp"
#include "metrics/metrics_writer.hpp"
#include "metrics/step_profiler.hpp"
#include "metrics/tensorboard_writer.hpp"
#include "model/transformer.hpp"
#include "optim/adamw.hpp"
#include "optim/optimizer.hpp"
#include "optim/lr_schedule.hpp"
#include "parallel/grad_sync.hpp"
#include "parallel/mixed_precision.hpp"
#include "train/device_comms.hpp"
#include "train/moe_balance.hpp"
#include "train/nonfinite_guard.hpp"
#include "train/parallel_context.hpp"
#include "train/step_schedule.hpp"

namespace meshtrain {

/// Final numbers of a run (also the metrics.jsonl summary record).
struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;           ///< mean CE of the last applied step (nats/token)
  double final_val_loss = -1;      ///< last validation loss, −1 when validation is off
  double unigram_entropy = 0;      ///< entropy of the validation tokens' unigram distribution (nats)
  double elapsed_s = 0;
  double tokens_per_s = 0;         ///< mean over the run, excluding the first step
};

/// What train_step() did.
struct StepResult {
  double loss = 0;            ///< global mean cross-entropy per target token (nats), plus the MoE aux losses
  double grad_norm = 0;       ///< global L2 norm of the gradient, before clipping
  double lr = 0;              ///< the schedule's learning rate for the step
  bool applied = true;        ///< false: non-finite, skipped (no update)
  int preempt_signal = 0;     ///< any rank's pending SIGTERM / SIGUSR1, agreed (0 = none)
  double seconds = 0;         ///< wall time of the step's work
  nlohmann::json comm_bytes;  ///< bytes sent per mesh dimension and collective kind in the step
  double moe_aux_loss = 0;    ///< MoE sequence-wise balance loss (included in loss; 0 when off)
  double moe_z_loss = 0;      ///< MoE router z-loss (included in loss; 0 when off)
  /// PaLM's z-loss on the output logits, [model] output_z_loss_coeff · mean log²Z per target
  /// token (nats; in the gradient, not in loss, so loss stays the plain cross-entropy).
  double z_loss = 0;
};

class Trainer {
 public:
  /// Builds everything a run needs and resumes from the checkpoint [checkpoint] names, if any.
  /// `cfg` must be validated for world.size() ranks and `dims` is what validate() returned;
  /// `store` is the opened cfg.training.dataset; `layout` places this job's ranks (communicators
  /// are split from it). All must outlive the Trainer. Collective over `world`.
  /// @throws ConfigError (a [profiling] or [debug] value this world cannot honour),
  ///         CheckpointError (a checkpoint that does not load), CommError.
  Trainer(const JobConfig& cfg, const ParallelDims& dims, const TokenStore& store, const RankLayout& layout,
          MpiCommunicator& world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains from the step after the resumed one to [training] steps, then finalize(). Rank 0
  /// writes metrics.jsonl, deck.resolved.toml and model_final.h5 into cfg.dump_folder().
  /// @throws PreemptedError (a signal: saved and stopped at a step boundary), NonFiniteError
  ///         (a non-finite step beyond skip_nonfinite_steps), CheckpointError, CommError.
  TrainSummary train();
  /// One optimizer step: the schedule's micro-batches, the strategy's reductions, the loss and
  /// gradient-norm reductions, the world-agreed non-finite check, then clipping and AdamW (or
  /// nothing, for a skipped step). Collective. @throws NonFiniteError, CommError.
  StepResult train_step(int64_t step);
  /// Mean validation loss (nats per token) over [validation] steps global batches of the
  /// validation split, forward only; the same number on every layout. Collective.
  double validate();
  /// Writes the checkpoint of `step` (…/step-NNNNNNNN.h5.tmp, every rank its hyperslabs) and
  /// publishes it (rename, `latest`, pruning). With [checkpoint] async_mode it first waits for
  /// the previous background write, then only stages the state in host memory (checked for
  /// NaN / inf) and returns while a background thread writes and publishes the file.
  /// Collective. @throws CheckpointError (also a failed previous background write), NonFiniteError.
  void save(int64_t step);
  /// Waits for the background checkpoint write in flight, if any, and reports it (log and a
  /// checkpoint_write record). Collective in effect: every rank's writer takes part in the write.
  /// @throws CheckpointError when that write, or one reported earlier by poll, failed (every
  ///         rank alike: the outcome is agreed); `latest` still names the previous checkpoint.
  void finish_async_save();
  /// [checkpoint] last_save_in_hf: the model-only last save `file` (step `step`) exported as a
  /// Hugging Face folder beside it (step-NNNNNNNN-hf, export_dtype) by rank 0; collective.
  /// @throws CheckpointError on every rank when the export fails.
  void save_hf(int64_t step, const std::string& file);
  /// Writes model_final.h5 (when [job] final_dump) and the summary record. Collective.
  TrainSummary finalize();

 private:
  void build_model();
  void resume();
  void open_outputs();
  void log_start();
  /// Rank 0 logs the planner's prediction of memory and step time for this run's layout
  /// (plan/planner.hpp), warning when the predicted peak exceeds the device or memory_limit_gib.
  /// @throws ConfigError for a [training] hardware that names no catalog entry or file.
  void log_prediction();
  void log_step(int64_t step, const StepResult& r);
  void note_peaks();
  /// Logs a finished background write and writes its checkpoint_write record; a failure is
  /// remembered for finish_async_save to throw.
  void report_async_save(const AsyncSaveResult& r);

  using Clock = std::chrono::steady_clock;
  const JobConfig& cfg_;
  const ParallelDims dims_;
  const RankLayout& layout_;
  MpiCommunicator& world_;
  const bool rank0_;
  const Clock::time_point t_start_;
  const ModelArgs args_;
  const int64_t local_batch_, seq_len_, global_batch_, accum_;

  DataLoader loader_, val_loader_;
  double unigram_ = 0;
  MeshCommunicators comms_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<DeviceComms> dcomms_;
  ParallelContext pc_;
  double peak_flops_ = 0;
  bool peak_measured_ = false;
  bool sharded_ = false;
  int zero_stage_ = 0;
  TensorParallel tp_;
  ContextParallel cp_;
  MoeStepMetrics moe_metrics_;  ///< the last step's MoE loads, losses and bias ranges
  CpStats cp_stats_;  ///< cp attention timings of the current step (cp_.stats points here)
  DType compute_dtype_ = DType::kF32;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<GradientSync> sync_;
  // The weight initialisation build_model chose, run by resume() only when no checkpoint of this
  // run is loaded: a resumed run's weights all come from the file, and initialising them first
  // cost as much as the load itself (Box–Muller over every parameter of the rank).
  std::vector<std::function<void()>> init_weights_;
  bool pipelined_ = false;                        // pp > 1
  PipelinePlan plan_;                             // pp > 1: the split and the schedule
  std::vector<std::unique_ptr<Executor>> execs_;  // one per stage on this rank (one without pp)
  std::unique_ptr<MixedPrecisionHooks> hooks_;
  std::unique_ptr<Optimizer> opt_;  ///< AdamW or Muon ([optimizer] name)
  /// Parameters whose bf16 compute copies the optimizer writes in its step (mixed precision,
  /// replicated parameters, AdamW): current after a step, not recast before their next use.
  std::vector<Parameter*> optimizer_written_copies_;
  std::unique_ptr<LrSchedule> lr_schedule_;
  std::unique_ptr<StepSchedule> schedule_;
  std::unique_ptr<NonFiniteGuard> guard_;
  std::vector<double> shard_terms_;  // this rank's Σ g² per local shard, from the norm's own pass

  std::filesystem::path out_dir_;
  std::string ckpt_dir_;
  TrainState resumed_;
  nlohmann::json load_event_;  // the checkpoint_load record, written once metrics.jsonl is open
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<StepProfiler> profiler_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<AsyncCheckpointer> async_ckpt_;  // [checkpoint] async_mode != "disabled"
  std::string async_failure_;                      // a failed background write not thrown yet

  int64_t first_step_ = 1;
  int64_t tokens_seen_ = 0;
  double last_lr_ = 0;
  double timed_s_ = 0;
  int64_t timed_tokens_ = 0;
  std::array<int64_t, kNumMemCategories> run_peak_{};  // per-category peaks over the whole run
  TrainSummary summary_;
};

/// Runs training as configured: Trainer(cfg, dims, store, layout, world).train().
/// @throws as Trainer's constructor and Trainer::train().
TrainSummary train(const JobConfig& cfg, const ParallelDims& dims, const TokenStore& store, const RankLayout& layout,
                   MpiCommunicator& world);

/// Checks that the dataset fits the model (vocabulary) before any work.
/// @throws ConfigError naming [model] vocab_size and the dataset.
void check_dataset(const JobConfig& cfg, const TokenStore& store);

/// Checks that [training] device can be used on this rank before any work: "cuda" needs a
/// build with CUDA and at least one visible GPU. @throws ConfigError naming the key.
void check_device(const JobConfig& cfg);

}  // namespace meshtrain
