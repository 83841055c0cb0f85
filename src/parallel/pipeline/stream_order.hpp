#pragma once
/// @file How a stream-ordered backend runs a schedule's communication, and the check that it
/// cannot deadlock or mismatch messages there.
///
/// PipelineRuntime posts each run of consecutive SEND / RECV actions of a rank's list as one
/// batch (Communicator::send_recv_batch). Over MPI every message is independent and tagged, so
/// validate_schedule()'s rules suffice. NCCL is stricter, and this file models it:
///  - a batch is one ncclGroupStart / ncclGroupEnd group on the rank's one communication
///    stream; the stream runs groups one after another, and a group starts only after every
///    compute action issued before it finished (the stream waits for the compute stream);
///  - a group completes once every one of its sends and receives has met its partner, i.e. the
///    partner's group has started too — the transfers of started groups progress together;
///  - a compute action waits for the group holding the receive it consumes;
///  - NCCL has no tags: between two ranks the k-th send is matched with the k-th receive, so
///    the sender's and the receiver's orders of messages on each rank pair must agree (over
///    MPI, tags keep activations and gradients of different stages apart).
/// check_stream_ordered() runs this model to completion (no costs needed: only the order of
/// events matters) and rejects a schedule whose groups would block each other forever or
/// whose messages would be matched with the wrong buffers.
#include <cstddef>
#include <vector>

#include "parallel/pipeline/schedule.hpp"

namespace meshtrain {

/// A maximal run [begin, end) of consecutive communication actions in one rank's list.
struct CommBatch {
  size_t begin = 0;
  size_t end = 0;
};

/// The batches of `list`, in list order: each maximal run of SEND / RECV actions. Throws nothing.
std::vector<CommBatch> communication_batches(const std::vector<Action>& list);

/// Checks `s` (already valid under validate_schedule) under the stream-ordered model above.
/// @throws ScheduleError naming the rank pair and the message whose send and receive orders
///         differ, or every rank's blocked action or group when the model deadlocks.
void check_stream_ordered(const PipelineSchedule& s);

}  // namespace meshtrain
