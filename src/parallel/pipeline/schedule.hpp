#pragma once
/// @file Pipeline-parallel schedules as data: per rank, the ordered list of actions that rank
/// runs in one training step (forward / backward of a stage on a micro-batch, and the
/// point-to-point sends and receives between stages). One runtime can execute any such list,
/// whether a generator below produced it or a CSV file described it (schedule_csv.hpp).
///
/// Schedules (names are TorchTitan's `[parallelism] pipeline_parallel_schedule` values):
///  - "GPipe" (Huang et al. 2019): all forwards, then all backwards; one stage per rank.
///  - "1F1B" (PipeDream-Flush, Narayanan et al. 2021): rank r runs pp − 1 − r warm-up
///    forwards, then alternates one forward and one backward; one stage per rank.
///  - "Interleaved1F1B" (Narayanan et al. 2021, Megatron-LM): v ≥ 2 stages per rank in loop
///    placement; forwards in groups of pp micro-batches per stage, Megatron's warm-up count.
///  - "InterleavedZeroBubble" (ZB-H1, Qi et al. 2024, on loop placement with v ≥ 1 stages per
///    rank): the backward is split into I (input gradient, on the critical path) and W (weight
///    gradient, deferred into bubbles); the micro-batches in flight (forward run, W not yet:
///    W still reads the saved activations) are capped at (interleaved) 1F1B's peak plus pp − 1,
///    whatever m is.
///  - "ZBVZeroBubble" (ZB-V, Qi et al. 2024): two stages per rank in V placement, split
///    backward, in-flight stage micro-batches (forward run, W not yet) capped at 1F1B's 2·pp
///    plus pp − 1 per rank.
/// Stage placement: loop style puts stages r, r + pp, r + 2·pp, … on rank r; V style puts
/// stages r and 2·pp − 1 − r on rank r (the last stage lives on rank 0, next to the first).
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain {

/// A schedule that breaks a rule (bad pp / micro-batch / stage combination, or a hand-written
/// list that is not executable). what() is one user-facing line naming the deck key or the
/// rank and action at fault; the config layer may prefix it with the deck's file name.
class ScheduleError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// What one action does. Communication actions name the stage on this rank they belong to:
/// kSendActivation(s, mb) sends stage s's output to the rank of stage s + 1;
/// kRecvActivation(s, mb) receives stage s's input from the rank of stage s − 1;
/// kSendGradient(s, mb) sends the gradient of stage s's input to the rank of stage s − 1;
/// kRecvGradient(s, mb) receives the gradient of stage s's output from the rank of stage s + 1.
enum class ActionType {
  kForward,         ///< F: forward of the stage
  kBackward,        ///< B: full backward (input and weight gradients)
  kBackwardInput,   ///< I: input-gradient half of a split backward
  kBackwardWeight,  ///< W: weight-gradient half of a split backward (after I)
  kSendActivation,
  kRecvActivation,
  kSendGradient,
  kRecvGradient,
};

/// One action of a rank's list.
struct Action {
  ActionType type;
  int stage;       ///< global stage index in [0, num_stages)
  int microbatch;  ///< in [0, microbatches)

  bool is_compute() const { return type <= ActionType::kBackwardWeight; }
  bool operator==(const Action&) const = default;
};

/// PyTorch pipelining's action string `{stage}{F|B|I|W}{mb}`, and `{stage}SEND_F{mb}`,
/// `RECV_F`, `SEND_B`, `RECV_B` for communication (e.g. "0F3", "2I1", "1SEND_B0").
std::string to_string(const Action& a);
/// Parses to_string()'s format. @throws ScheduleError naming the text when it is malformed.
Action parse_action(const std::string& text);

enum class StagePlacement { kLoop, kV };

/// A whole step's schedule: `ranks[r]` is rank r's ordered action list.
struct PipelineSchedule {
  std::string name;       ///< generator name, or "csv"
  int pp = 1;             ///< pipeline ranks
  int stages_per_rank = 1;  ///< v
  int microbatches = 1;   ///< m, per step
  StagePlacement placement = StagePlacement::kLoop;
  std::vector<std::vector<Action>> ranks;

  int num_stages() const { return pp * stages_per_rank; }
  /// The rank that holds `stage`. @throws ScheduleError for a stage outside [0, num_stages).
  int rank_of(int stage) const;
  /// The stages rank r holds, in chunk order (chunk 0 first).
  std::vector<int> stages_of(int rank) const;
};

/// The five schedule names, in TorchTitan's spelling.
const std::vector<std::string>& schedule_names();
/// Whether `name` runs several stages per rank (Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble).
/// @throws ScheduleError for an unknown name, listing the known ones.
bool is_multi_stage(const std::string& name);

/// Checks a (schedule, pp, m, v) combination against the schedule's rules:
/// pp ≥ 1, m ≥ 1; GPipe and 1F1B: v = 1; 1F1B: m ≥ pp; Interleaved1F1B: v ≥ 2 and m a multiple
/// of pp (Megatron-LM's rule); InterleavedZeroBubble: v ≥ 1 and m a multiple of pp (m ≥ pp);
/// ZBVZeroBubble: v = 2 and m ≥ 2·pp.
/// @throws ScheduleError naming `[parallelism] pipeline_parallel_schedule` (unknown name, wrong v)
///         or `[parallelism] pipeline_parallel_microbatch_size` (micro-batch count) and the rule.
void check_schedule_rules(const std::string& name, int pp, int microbatches, int stages_per_rank);

/// Generates, checks (validate_schedule) and returns the schedule `name` for pp ranks, m
/// micro-batches and v stages per rank, communication actions included.
/// @throws ScheduleError as check_schedule_rules().
PipelineSchedule make_schedule(const std::string& name, int pp, int microbatches, int stages_per_rank);

/// The forward-only schedule of validation over `s`'s stages and placement: one micro-batch
/// (0), each rank running its stages in ascending order — RECV_F before F when the previous
/// stage lives on another rank, SEND_F after it when the next one does. PipelineRuntime::
/// evaluate runs exactly these lists (each run of communication actions as one batch), and
/// they pass check_stream_ordered (stages ascend along the pipeline, so every receive's sender
/// runs its forward first). Throws nothing for a schedule that rank_of accepts.
PipelineSchedule forward_only_schedule(const PipelineSchedule& s);

/// Adds the communication actions a list of compute actions needs (existing ones are dropped
/// first): SEND right after the F / B / I that produced the value, and RECV, for an F / B / I
/// whose neighbouring stage lives on another rank, in the receiver's first gap between compute
/// actions that starts no earlier than the SEND in the unit-cost simulation (simulate.hpp) —
/// so each receive is posted about when its message is sent, and on a stream-ordered backend
/// the sender's and the receiver's groups meet (stream_order.hpp). Receives posted early cost
/// only their buffers; the simulated timeline (and so the bubble) is that of placing every
/// RECV right before its consumer. Lists that cannot be simulated (a missing action, a
/// deadlock) keep each RECV right before its consumer, for validate_schedule() to diagnose.
/// Throws nothing.
void insert_communication(PipelineSchedule& s);

/// Checks that `s` can run: every action's stage lives on the rank whose list holds it; each
/// (stage, mb) has exactly one F and either one B or one I and one W, W after I; each F after
/// its input is available (F(s − 1, mb) earlier on the same rank, or a RECV earlier on this rank
/// matched by a SEND after F(s − 1, mb) on the other); each B / I after its F and after its
/// output gradient is available (likewise from B / I(s + 1, mb)); every SEND has exactly one
/// RECV and vice versa, matched in the same order on each (sender, receiver, kind) channel; and
/// the lists finish under the unit-cost simulation (simulate.hpp), i.e. no deadlock; and they
/// also finish, with every message matched to its own buffer, on a stream-ordered backend
/// such as NCCL (check_stream_ordered, stream_order.hpp).
/// @throws ScheduleError naming the rank, the action (to_string form) and the rule broken.
void validate_schedule(const PipelineSchedule& s);

}  // namespace meshtrain
