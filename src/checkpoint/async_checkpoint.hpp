#pragma once
/// @file Asynchronous checkpoints ([checkpoint] async_mode = "async" / "async_with_pinned_mem";
/// doc/checkpoint-format.md, "Asynchronous saves"). The save step stages the rank's state into
/// host memory (stage_checkpoint); a background thread of each rank then writes the HDF5 file
/// with the ordinary writer (write_checkpoint), flushes, fsyncs and publishes it (rename,
/// `latest`, keep_latest_k) while training continues.
///
/// How the writers coordinate: parallel HDF5 is collective, so the background threads of all
/// ranks run their own collectives (H5Fcreate, dataset creation, the checksum gather, the
/// outcome agreement, the collective close) over a communicator of their own, an MPI_Comm_dup
/// of the world made when the AsyncCheckpointer is built. Collectives on different
/// communicators never match each other, so the writers' and the training's collectives
/// interleave freely; that needs MPI_THREAD_MULTIPLE. At most one write is in flight per rank
/// (the next save, the end of the run, a preemption and the final model wait for it), and the
/// trainer calls no HDF5 function while one is: this HDF5 build is not thread-safe.
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "checkpoint/sharded_checkpoint.hpp"

namespace meshtrain {

/// Checks that MPI was initialized with MPI_THREAD_MULTIPLE (MPI_Query_thread), which the
/// background writers need. `origin` is the deck location of [checkpoint] async_mode
/// ("deck.toml:12" or "command line"), `mode` its value ("async", "async_with_pinned_mem").
/// @throws ConfigError naming the key, the value and the thread level the library provides.
void require_mpi_thread_multiple(const std::string& origin, const std::string& mode);

/// What one background write came to. The outcome is agreed over the writers' communicator, so
/// every rank holds the same ok / error.
struct AsyncSaveResult {
  int64_t step = 0;
  std::string file;      ///< the checkpoint file (…/step-NNNNNNNN.h5) it was to publish
  bool ok = false;       ///< written, fsync'ed and published as `latest`
  std::string error;     ///< why not (names the file); the previous checkpoint stays `latest`
  double write_s = 0;    ///< seconds from the start of the write to its publication (or failure)
  int64_t bytes = 0;     ///< size of the published file on rank 0 (0 on other ranks or on failure)
};

/// One rank's background checkpoint writer: a communicator, a thread per write, the result.
/// Used from the training thread only (not itself thread-safe).
class AsyncCheckpointer {
 public:
  /// Duplicates `world` for the writers (collective over `world`). `folder` is the checkpoint
  /// folder, `keep_latest_k` the number of step files kept (0 = all), as publish_checkpoint;
  /// `origin` and `mode` locate and give [checkpoint] async_mode for the error message.
  /// @throws ConfigError (require_mpi_thread_multiple) when MPI lacks MPI_THREAD_MULTIPLE,
  ///         CommError when MPI_Comm_dup fails.
  AsyncCheckpointer(MPI_Comm world, std::string folder, int64_t keep_latest_k, const std::string& origin,
                    const std::string& mode);
  /// Waits for the write in flight (its result is dropped; a failed write was not published).
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  /// The previous write's snapshot, whose host buffers stage_checkpoint may reuse; null before
  /// the first write. Only while no write is in flight.
  CheckpointSnapshot* recycle() { return in_flight() || !have_last_ ? nullptr : &last_; }
  /// Starts writing the staged `snap` as the checkpoint of `step` (…/step-NNNNNNNN.h5.tmp, then
  /// published) on a new thread and returns at once. Every rank calls it for the same step.
  /// @throws std::logic_error when a write is still in flight or `snap` is not staged.
  void start(int64_t step, CheckpointSnapshot&& snap);
  /// The result of the last write when it has finished and was not taken yet; never blocks.
  /// Local: ranks may see the same write finish at different calls.
  std::optional<AsyncSaveResult> poll();
  /// Blocks until no write is in flight; returns the result not taken yet, if any.
  std::optional<AsyncSaveResult> wait();
  /// A write was started and not yet joined (it may have finished).
  bool in_flight() const { return thread_.joinable(); }

 private:
  void run(int64_t step);  // the background thread: write, publish, agree

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::string folder_;
  int64_t keep_latest_k_ = 0;
  CheckpointSnapshot last_;  // being written, then kept for its buffers
  bool have_last_ = false;
  std::thread thread_;
  std::atomic<bool> done_{false};
  AsyncSaveResult result_;
  bool result_taken_ = true;
};

}  // namespace meshtrain
