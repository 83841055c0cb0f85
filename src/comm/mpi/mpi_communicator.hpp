#pragma once
/// @file MpiCommunicator: Communicator over one MPI communicator with non-blocking MPI
/// collectives (MPI-3 MPI_Iallreduce etc.), and MpiRuntime, the process-wide MPI init/finalize.
#include <mpi.h>

#include <string>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_chunking.hpp"

namespace meshtrain {

/// RAII MPI_Init_thread / MPI_Finalize. Errors return codes (MPI_ERRORS_RETURN) so they become
/// CommError exceptions that name the collective and group. The destructor also frees the
/// user-defined bfloat16 reduction ops (MpiCommunicator) before MPI_Finalize. A fatal signal
/// (SIGSEGV, SIGBUS, SIGILL, SIGFPE) after MPI_Init is reported by install_crash_report, with
/// the rank and host in every line.
class MpiRuntime {
 public:
  /// Initializes MPI asking for `thread_level`: MPI_THREAD_FUNNELED (only the main thread calls
  /// MPI), or MPI_THREAD_MULTIPLE when other threads call MPI too (asynchronous checkpoint
  /// writers). What the library grants is what MPI_Query_thread reports afterwards.
  MpiRuntime(int* argc, char*** argv, int thread_level = MPI_THREAD_FUNNELED);
  ~MpiRuntime();
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  const std::string& host() const { return host_; }
  /// Ends the whole job (every rank) with `status`: used when one rank fails so none hang.
  /// MPI_Abort, and this process's own _exit(status) 10 s later should MPI_Abort not return
  /// (a node cut off from the launcher).
  [[noreturn]] static void abort_job(int status);

 private:
  int rank_ = 0, size_ = 1;
  std::string host_;
};

/// Tensors are host memory: f32, i32, or bf16. MPI has no bfloat16 type, so bf16 moves as
/// MPI_UINT16_T and reduces (sum, max, min) through user-defined commutative MPI_Ops that
/// widen each pair to float and round sums back to nearest-even (created at first use, on the
/// MPI thread).
///
/// Tensors of any size (int64 elements): every call is issued as one or more MPI calls of at
/// most mpi_max_count() elements each (mpi_chunking.hpp), in the same order on every rank, and
/// the returned Work completes when all of them completed (one deadline for the whole call).
/// A call that fits the limit is the single MPI call it always was. Past the limit:
/// all_reduce, broadcast, send and recv move consecutive slices; all_gather and all_to_all move
/// slice k of every rank's block in one call through a derived datatype (a chunk of the block,
/// resized to the block's extent); reduce_scatter reduces slice k of block j onto rank j with
/// one MPI_Ireduce per (slice, rank). For the collectives with per-rank blocks "fits" means
/// ranks × block ≤ the limit (per_rank_max_count), since MPI implementations total that in an
/// int. A receive must be posted with the sender's element count (both sides chunk it the same
/// way; a larger receive would wait for a chunk that is never sent).
class MpiCommunicator final : public Communicator {
 public:
  /// Wraps `comm` (duplicated, freed on destruction) under the group name `name`.
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  /// The communicator of the ranks sharing `color`, ordered by `key` (MPI_Comm_split).
  std::unique_ptr<MpiCommunicator> split(int color, int key, const std::string& name) const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm comm() const { return comm_; }

  std::unique_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> broadcast(const Tensor& t, int root) override;
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Work> recv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Work> all_to_all(const Tensor& in, const Tensor& out) override;
  /// MPI_Ialltoallv over a contiguous row datatype (counts and displacements in rows).
  std::unique_ptr<Work> all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                                     const std::vector<int64_t>& recv_rows) override;
  void barrier() override;
  /// Blocking; `values` [n] doubles. @throws std::invalid_argument when n < 0, CommError from MPI.
  void all_reduce_host(double* values, int n, ReduceOp op) override;
  /// Deadline of every collective issued from now on (seconds; <= 0 waits forever). When one
  /// passes, the rank prints the collective and group and aborts the whole job (exit 3).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  /// "dimension 'dp_replicate' group 3 (4 ranks, this rank 1)", used in watchdog messages; an
  /// unsplit communicator is group 0 of its dimension ("dimension 'world' group 0 (...)").
  std::string describe() const;

 private:
  double timeout_s_ = 300;
  int group_ = -1;  // color this communicator was split with (-1: not split)
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 1;
};

}  // namespace meshtrain
