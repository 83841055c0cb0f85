#include "checkpoint/async_checkpoint.hpp"

#include <chrono>
#include <filesystem>
#include <stdexcept>

#include "checkpoint/checkpoint_folder.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

}  // namespace

void require_mpi_thread_multiple(const std::string& origin, const std::string& mode) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided >= MPI_THREAD_MULTIPLE) return;
  throw ConfigError(origin + ": [checkpoint] async_mode: \"" + mode +
                    "\" writes checkpoints from a background thread, which needs MPI_THREAD_MULTIPLE, but this MPI "
                    "library provides only " + thread_level_name(provided) +
                    " (use async_mode = \"disabled\", or an MPI built with thread support)");
}

AsyncCheckpointer::AsyncCheckpointer(MPI_Comm world, std::string folder, int64_t keep_latest_k, const std::string& origin,
                                     const std::string& mode)
    : folder_(std::move(folder)), keep_latest_k_(keep_latest_k) {
  require_mpi_thread_multiple(origin, mode);
  if (MPI_Comm_dup(world, &comm_) != MPI_SUCCESS) throw CommError("MPI_Comm_dup of the world for the checkpoint writers failed");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (thread_.joinable()) thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void AsyncCheckpointer::start(int64_t step, CheckpointSnapshot&& snap) {
  if (thread_.joinable()) throw std::logic_error("AsyncCheckpointer::start: a write is still in flight (wait() first)");
  if (!snap.staged) throw std::logic_error("AsyncCheckpointer::start: the snapshot of step " + std::to_string(step) + " is not staged");
  last_ = std::move(snap);
  have_last_ = true;
  done_ = false;
  result_taken_ = false;
  thread_ = std::thread([this, step] { run(step); });
}

void AsyncCheckpointer::run(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  AsyncSaveResult r;
  r.step = step;
  r.file = (std::filesystem::path(folder_) / checkpoint_file_name(step)).string();
  try {
    write_checkpoint(r.file + ".tmp", comm_, last_, nullptr);
    // Rank 0 publishes (fsync, rename, `latest`, pruning); every writer learns whether that
    // worked, so the outcome is the same on every rank.
    std::string error;
    if (rank_ == 0) try {
        publish_checkpoint(folder_, step, keep_latest_k_);
        r.bytes = int64_t(std::filesystem::file_size(r.file));
      } catch (const std::exception& e) {
        error = e.what();
      }
    int failed = error.empty() ? 0 : 1;
    if (MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm_) != MPI_SUCCESS)
      throw CommError(r.file + ": the checkpoint writers could not agree on the publication");
    if (failed)
      throw CheckpointError(rank_ == 0 ? error : r.file + ": publishing the checkpoint of step " + std::to_string(step) +
                                                     " failed on rank 0");
    r.ok = true;
  } catch (const std::exception& e) {
    r.ok = false;
    r.bytes = 0;
    r.error = e.what();
  }
  r.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result_ = std::move(r);
  done_.store(true, std::memory_order_release);
}

std::optional<AsyncSaveResult> AsyncCheckpointer::poll() {
  if (!thread_.joinable() || !done_.load(std::memory_order_acquire)) return std::nullopt;
  return wait();
}

std::optional<AsyncSaveResult> AsyncCheckpointer::wait() {
  if (thread_.joinable()) thread_.join();
  if (result_taken_) return std::nullopt;
  result_taken_ = true;
  return result_;
}

}  // namespace meshtrain
