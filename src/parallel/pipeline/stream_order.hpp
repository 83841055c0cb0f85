#pragma once
/// @file How a stream-ordered backend runs point-to-point exchanges, and the check that they
/// cannot deadlock or mismatch messages there.
///
/// Over MPI every message is independent and tagged, so an exchange in which two ranks each
/// post a receive and then a send completes. NCCL is stricter, and this file models it:
///  - each call that posts transfers (send(), recv(), or one send_recv_batch() of several) is
///    one ncclGroupStart / ncclGroupEnd group on the rank's communication stream of that
///    communicator; the stream runs groups one after another, and a group starts only after
///    every compute step issued before it finished (the stream waits for the compute stream);
///  - a group completes once every one of its sends and receives has met its partner, i.e. the
///    partner's group has started too — the transfers of started groups progress together;
///  - a compute step (a kernel, or Work::wait(), which makes the compute stream wait) waits for
///    the groups it names;
///  - NCCL has no tags: between two ranks the k-th send is matched with the k-th receive, so
///    the sender's and the receiver's orders of messages on each rank pair must agree (over
///    MPI, tags keep activations and gradients of different stages apart).
/// check_stream_programs() runs this model to completion (no costs needed: only the order of
/// events matters) over one program per rank. A pipeline schedule's action lists become such
/// programs (check_stream_ordered: each run of consecutive SEND / RECV actions is one batch,
/// as PipelineRuntime posts it); the trainer's other exchanges are recorded from the code that
/// posts them (train/stream_recorder.hpp) and checked the same way, so an exchange that posts
/// a receive and a send as two calls on both ranks (both block in their receive) is caught on
/// a CPU.
#include <cstddef>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.hpp"

namespace meshtrain {

/// One send or receive of a modelled group.
struct StreamTransfer {
  bool send = true;
  int peer = 0;         ///< the rank on the other end: an index into the programs
  std::string message;  ///< what the poster means it to carry; the k-th send and the k-th
                        ///< receive between two ranks must name the same message
  std::string text;     ///< how the action or call that posted it is written in errors
};

/// One step of a rank's program: a group of transfers (`group` non-empty), or a compute step
/// that runs once the groups at the step indices `waits` (this rank's) completed — a group
/// after the step can never complete first, which the model reports as a deadlock.
struct StreamStep {
  std::vector<StreamTransfer> group;
  std::vector<size_t> waits;
  std::string text;  ///< a compute step as written in errors
};

/// One rank's steps in issue order.
using StreamProgram = std::vector<StreamStep>;

/// Runs `ranks` (one program per rank of one communicator) under the stream-ordered model
/// above. `what` names the exchange in errors ("schedule 1F1B", "tied embedding gradient sum").
/// @throws ScheduleError naming the rank pair and the message whose send and receive orders
///         differ or that has no partner, or, when the model deadlocks, every rank's blocked
///         step or group; std::invalid_argument for a peer outside [0, ranks.size()) or a wait
///         that names no group.
void check_stream_programs(const std::vector<StreamProgram>& ranks, const std::string& what);

/// A maximal run [begin, end) of consecutive communication actions in one rank's list.
struct CommBatch {
  size_t begin = 0;
  size_t end = 0;
};

/// The batches of `list`, in list order: each maximal run of SEND / RECV actions. Throws nothing.
std::vector<CommBatch> communication_batches(const std::vector<Action>& list);

/// The programs PipelineRuntime runs for `s`: per rank, each batch of communication_batches()
/// as one group, each F / B / I as a compute step waiting for the group holding the receive it
/// consumes (W consumes nothing). Messages are (kind, receiving stage, micro-batch).
/// @throws ScheduleError when a communication action's neighbouring stage does not exist.
std::vector<StreamProgram> schedule_programs(const PipelineSchedule& s);

/// Checks `s` (already valid under validate_schedule) under the stream-ordered model:
/// check_stream_programs(schedule_programs(s), "schedule " + s.name).
/// @throws ScheduleError as check_stream_programs().
void check_stream_ordered(const PipelineSchedule& s);

}  // namespace meshtrain
