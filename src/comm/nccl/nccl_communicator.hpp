#pragma once
/// @file NcclCommunicator: the Communicator interface on one NCCL communicator (a mesh
/// dimension's group, from NcclMesh::get) for tensors on a CudaDevice (DESIGN.md data flow
/// step 4). Collectives are stream-ordered on a communication stream of this communicator's
/// own (CudaDevice::create_comm_stream), so one mesh dimension's collectives never queue behind
/// another's (a tp all-reduce behind an fsdp prefetch). No host blocking on the hot path.
///
/// Ordering rule (every edge between streams is one of these):
///  1. Before a collective is queued, its stream waits for all compute work queued so far (an
///     event on the compute stream): it reads what the compute stream wrote before the call.
///  2. Work::wait(), or dropping an unwaited Work, makes the compute stream wait for the
///     collective's completion event: kernels queued later see its result.
///  3. Within one communicator collectives run in issue order; the streams of two
///     communicators are not ordered against each other. A collective that consumes another
///     dimension's result must therefore be issued after that result's wait() (or after its
///     test() answered true) — which code written for MPI, where a result exists only then,
///     already does; rule 1 then carries the edge through the compute stream.
///  4. Every rank issues the collectives of all its communicators in one program order (the
///     trainer is SPMD). NCCL lets several communicators run at once on one GPU only under that
///     condition (NCCL user guide, "Using multiple NCCL communicators concurrently").
/// Memory: a Work keeps its tensors alive until rule 2 ordered the compute stream after the
/// collective (or it was seen complete), so the caching allocator, which hands blocks out in
/// compute-stream order, never gives them to work that could run during the collective.
///
/// Watchdog: every collective gets a deadline (set_timeout) counted from when it was queued.
/// A background thread per communicator polls the in-flight collectives' completion events and
/// ncclCommGetAsyncError; on an asynchronous NCCL error or a missed deadline it prints one line
/// in the MPI watchdog's format — "[rank R host] watchdog: all_reduce (NCCL) on dimension 'tp'
/// group 3 (4 ranks, this rank 1) did not complete within 300 s (a rank died or hangs);
/// aborting the job" — aborts the NCCL communicator (ncclCommAbort) and ends the whole job with
/// exit status 3 (MpiRuntime::abort_job; MPI_Abort from the watchdog thread, the one MPI call
/// made off the main thread). A CUDA error it sees (a faulted context: nothing will complete)
/// ends the job the same way with status 1. Compiled only when CUDA and NCCL are found.
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_communicator.hpp"

namespace meshtrain {

class CudaDevice;

class NcclCommunicator final : public Communicator {
 public:
  /// Wraps `comm` (not owned: NcclMesh creates and destroys it; it must outlive this object and
  /// be ready, i.e. non-blocking initialization finished) for tensors on `dev`. `mpi` is the MPI
  /// communicator of the same group (same ranks, same order); barrier() and all_reduce_host()
  /// go through it, and its describe() names the group in errors. `name` is the dimension name.
  /// Starts the watchdog thread. Call on the thread that issues MPI and CUDA work.
  /// @throws CommError when the NCCL communicator's size or rank differs from `mpi`'s, or when
  ///         NCCL cannot report them.
  NcclCommunicator(ncclComm_t comm, CudaDevice& dev, MpiCommunicator& mpi, std::string name);
  /// Waits until every collective issued on this communicator completed (the watchdog still
  /// enforces their deadlines), then stops the watchdog thread. Throws nothing.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  ncclComm_t comm() const { return comm_; }
  /// The stream this communicator's collectives run on (owned by the CudaDevice).
  cudaStream_t stream() const { return stream_; }

  // Collectives on contiguous device tensors of dtype f32, bf16 or i32 (ncclFloat32,
  // ncclBfloat16, ncclInt32), in and out of one dtype; sizes and semantics as Communicator.
  // Each throws std::invalid_argument on mismatched sizes or dtypes, and CommError naming the
  // NCCL call, the group and ncclGetErrorString when NCCL rejects the call. The returned Work
  // keeps the tensors alive until the compute stream was made to wait for the collective
  // (wait(), or the Work's destruction) or the collective was seen complete (test()), so the
  // caching allocator never hands their memory to work that could run concurrently with it.
  // Bytes are counted with the same ring formulas as MpiCommunicator (communicator.hpp).

  std::unique_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> broadcast(const Tensor& t, int root) override;
  /// ncclSend. NCCL has no tags: `tag` is ignored, and the sends and receives between two ranks
  /// match in the order they were issued. Sends and receives run one after another on the one
  /// communication stream, so a pair that must progress concurrently (rank A sends to B while B
  /// sends to A) deadlocks unless both sides order them send-before-recv on one side and
  /// recv-before-send on the other; all_to_all fuses its transfers in one NCCL group instead.
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override;
  /// ncclRecv; see send() on tags and ordering.
  std::unique_ptr<Work> recv(const Tensor& t, int peer, int tag) override;
  /// One NCCL group (ncclGroupStart / ncclGroupEnd) of the ops' ncclSend / ncclRecv, in order,
  /// on the communication stream: its transfers progress concurrently, so a rank may send to
  /// and receive from a peer that does the same. Tags are ignored as in send(). The Works share
  /// the group's completion event and deadline; each keeps its own tensor alive. Sends count
  /// their bytes as send_recv. @throws std::invalid_argument for a peer outside the group, and
  /// CommError as the collectives.
  std::vector<std::unique_ptr<Work>> send_recv_batch(const std::vector<P2POp>& ops) override;
  /// One NCCL group of size() ncclSend / ncclRecv pairs (rank j gets block j of in); in and out
  /// must not overlap.
  std::unique_ptr<Work> all_to_all(const Tensor& in, const Tensor& out) override;
  /// One NCCL group of ncclSend / ncclRecv per peer with a non-empty block.
  std::unique_ptr<Work> all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                                     const std::vector<int64_t>& recv_rows) override;
  /// A host barrier over the MPI communicator of the group. It does not wait for device work:
  /// call CudaDevice::synchronize() first when that is needed.
  void barrier() override;
  /// Blocking fp64 all-reduce of host scalars over the MPI communicator of the group.
  void all_reduce_host(double* values, int n, ReduceOp op) override;

  /// Deadline (seconds) of every collective issued from now on, counted from when it is queued
  /// (<= 0: none). A missed deadline aborts the job (exit 3).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  /// "dimension 'tp' group 3 (4 ranks, this rank 1)", the group's MPI description.
  const std::string& describe() const { return group_; }

 private:
  struct InFlight;  // one queued collective: its completion event and deadline
  struct Watchdog;  // the thread and the list of in-flight collectives it watches
  std::shared_ptr<InFlight> begin(const char* what);
  std::unique_ptr<Work> finish(std::shared_ptr<InFlight> op, ncclResult_t r, const char* call,
                               std::vector<Tensor> keep);
  void await_enqueued(ncclResult_t r, const char* what, const char* call);
  void watch();
  [[noreturn]] void fatal(const char* what, const std::string& why, int status) const;

  ncclComm_t comm_;
  CudaDevice& dev_;
  cudaStream_t stream_ = nullptr;  // from dev_.create_comm_stream()
  MpiCommunicator& mpi_;
  std::string name_;
  std::string group_;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 300;
  int world_rank_ = 0;  // for watchdog messages, taken on the MPI thread
  std::string host_;
  std::unique_ptr<Watchdog> wd_;
};

}  // namespace meshtrain
