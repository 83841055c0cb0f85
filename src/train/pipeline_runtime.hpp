#pragma once
/// @file PipelineRuntime: runs one rank's action list of a pipeline schedule
/// (parallel/pipeline/schedule.hpp) — any list, generated or read from CSV — over this rank's
/// stages, exchanging activations and their gradients with the neighbouring stages on the pp
/// communicator (DESIGN.md, pipeline parallelism).
///
/// One optimizer step is `rounds` pipeline rounds (gradient accumulation), each the schedule's
/// m micro-batches of `microbatch_size` samples: round r of data rank d covers the samples
/// cursor + (r·dp + d)·local_batch + [0, local_batch) — the same global batch, in the same
/// order, as the run without pipeline parallelism — and micro-batch j of the round its samples
/// [j·microbatch_size, (j + 1)·microbatch_size).
///
/// Actions:
///  - F(s, j): the stage's executor forward of j; its input is the activation received for
///    (s, j) or produced by F(s − 1, j) on this rank; the last stage adds the loss;
///  - B / I / W(s, j): fused backward, or its input and weight halves (executor.hpp); the
///    output gradient is the one received for (s, j) or produced by B / I(s + 1, j) here;
///  - RECV_F / RECV_B post a non-blocking receive into a new buffer [N, D] (N = the
///    micro-batch's tokens, divided by tp under sequence parallelism), waited for only when an
///    action uses it — the wait is this rank's pipeline idle time; SEND_F / SEND_B post a
///    non-blocking send of the tensor F / B / I produced, kept alive until it completes (all
///    are waited for at the end of the round). Waits run under the communicator's deadline
///    (the watchdog), so a dead neighbour is a CommError, never a hang.
/// Each run of consecutive SEND / RECV actions is posted as one batch
/// (Communicator::send_recv_batch): one NCCL group on the communication stream, or independent
/// MPI transfers. validate_schedule() proved the list free of deadlock and of mismatched
/// messages under exactly this batching (stream_order.hpp), and insert_communication() places
/// receives so that generated schedules pass. Message tags encode (kind, receiving stage,
/// micro-batch), so several messages may be in flight on one channel over MPI; NCCL, which has
/// no tags, gets the same matching from the order check.
///
/// The data-parallel strategy learns from the list which backward of the step is each stage's
/// first and last (GradientSync::set_micro_batch_role): its reductions start after each stage's
/// last backward (or W) of the step's last round.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.hpp"
#include "data/loader.hpp"
#include "graph/executor.hpp"
#include "model/transformer.hpp"
#include "parallel/grad_sync.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/pipeline/stream_order.hpp"
#include "train/parallel_context.hpp"
#include "train/step_schedule.hpp"

namespace meshtrain {

/// One of this rank's stages: its global index and the executor over its units.
struct PipelineStage {
  int index = 0;
  Executor* exec = nullptr;
};

class PipelineRuntime final : public StepSchedule {
 public:
  /// `stages`: this rank's stages (schedule.stages_of(pp.rank()), any order); `schedule` must
  /// be validated (validate_schedule). `pp` carries activations (device tensors). Loss and
  /// poisoning as AccumulationSchedule, on every stage: the last stage's loss gradient of the
  /// step's last micro-batch is NaN, and so is the output gradient that this rank's other
  /// stages' backward of that micro-batch receives ([debug] inject_nonfinite_grad_*, so a rank
  /// without the loss can be the faulty one). All references must outlive the runtime.
  /// @throws std::invalid_argument when `stages` are not this rank's, or local_batch is not a
  /// multiple of microbatch_size · m … (config validation rejects such decks first);
  /// ScheduleError when validation's forward-only lists would not complete on a
  /// stream-ordered backend (check_stream_ordered; never for a generated schedule).
  PipelineRuntime(Transformer& model, std::vector<PipelineStage> stages, PipelineSchedule schedule, GradientSync& sync,
                  const DataLoader& loader, const ParallelContext& pc, Communicator& pp, int64_t local_batch,
                  int64_t microbatch_size, int64_t seq_len, int64_t rounds, float loss_grad_scale,
                  std::function<bool(int64_t)> poisoned = {});
  ~PipelineRuntime() override;

  /// Runs the step's rounds. Returns this rank's summed cross-entropy (nats; 0 unless it holds
  /// the last stage). @throws CommError (a receive past its deadline, a failed send).
  double run(int64_t step) override;
  /// Forward only of `n` samples through the pipeline, stage after stage (validation): this
  /// rank's list of forward_only_schedule(), each run of communication actions posted as one
  /// batch — the lists check_stream_ordered() accepted in the constructor. Every rank of the pp
  /// group calls it with the same samples. Returns {loss sum, targets}, non-zero on the rank
  /// holding the last stage. @throws CommError.
  EvalSums evaluate(const int32_t* samples, int64_t n) override;
  std::string describe() const override;
  /// Seconds this rank waited in receives (pipeline bubbles and transfer time) since the last
  /// call, then resets.
  double take_recv_wait_seconds();

 private:
  enum Kind { kActivation = 0, kGradient = 1 };
  using Key = std::tuple<int, int, int>;  // kind, stage, micro-batch
  struct Pending {
    Tensor buffer;
    std::unique_ptr<Work> work;
  };
  void run_round(int64_t step, int64_t round);
  void run_action(const Action& a, int64_t round);  // a compute action
  void post_communication(const Action* first, const Action* last);  // one batch of SEND / RECV
  Executor& exec_of(int stage);
  StepContext& context(int mb);
  Tensor take(Kind kind, int stage, int mb);  // the received or locally produced tensor (waits)
  int tag(Kind kind, int stage, int mb) const;
  Tensor message_buffer(int mb);
  void poll_sends(bool block);

  Transformer& model_;
  std::map<int, Executor*> stages_;
  PipelineSchedule schedule_;
  GradientSync& sync_;
  const DataLoader& loader_;
  ParallelContext pc_;
  Communicator& pp_;
  int64_t local_batch_, microbatch_size_, seq_len_, rounds_;
  float loss_grad_scale_;
  std::function<bool(int64_t)> poisoned_;
  std::vector<Action> actions_;                       // this rank's list
  std::vector<CommBatch> batches_;                    // its runs of SEND / RECV, posted together
  std::vector<Action> eval_actions_;                  // this rank's list of forward_only_schedule()
  std::vector<CommBatch> eval_batches_;
  std::map<int, std::pair<size_t, size_t>> backward_span_;  // stage → its first and last B / W action

  // Per round.
  std::vector<int32_t> round_samples_;  // [local_batch, seq_len + 1]
  std::map<int, StepContext> contexts_;
  std::map<Key, Tensor> ready_;         // produced on this rank, or received and waited for
  std::map<Key, Pending> receiving_;
  std::vector<Pending> sending_;
  double loss_sum_ = 0;
  bool poison_round_ = false;
  double recv_wait_s_ = 0;
};

}  // namespace meshtrain
