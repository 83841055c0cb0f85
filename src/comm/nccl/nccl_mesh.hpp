#pragma once
/// @file NcclMesh: the NCCL side of DESIGN.md data flow step 4 — a world NCCL communicator whose
/// unique id is broadcast over MPI, and one communicator per mesh dimension split from it with
/// ncclCommSplit using the same colors and keys as the MPI communicators (RankLayout::color /
/// key). Created non-blocking; initialization is polled with ncclCommGetAsyncError under the
/// [comm] init deadline, and a hung communicator is aborted (ncclCommAbort) with the same
/// job-wide exit as the MPI watchdog. Compiled only when CUDA and NCCL are found.
#include <mpi.h>
#include <nccl.h>

#include <array>

#include "layout/rank_layout.hpp"

namespace meshtrain {

class NcclMesh {
 public:
  /// Collective over `world` (MPI): every rank must call it with the same layout, after
  /// selecting its GPU (cudaSetDevice). One GPU hosts one NCCL rank (NCCL 2.28).
  /// @throws CommError naming the NCCL call and dimension when creation fails; aborts the job
  ///         (exit 3) when it does not finish within timeout_s.
  NcclMesh(MPI_Comm world, const RankLayout& layout, double timeout_s);
  /// Finalizes every communicator (ncclCommFinalize, all issued before any is waited for, then
  /// each polled with ncclCommGetAsyncError until it leaves ncclInProgress) and destroys it
  /// (ncclCommDestroy); one that reports an error or is still in progress after timeout_s is
  /// aborted (ncclCommAbort) with a line on stderr. Collective in effect: the peers finalize
  /// too. Every NcclCommunicator over these communicators must be gone. Throws nothing.
  ~NcclMesh();
  NcclMesh(const NcclMesh&) = delete;
  NcclMesh& operator=(const NcclMesh&) = delete;

  ncclComm_t world() const { return world_; }
  /// The NCCL communicator of this rank's group in dimension d.
  ncclComm_t get(MeshDim d) const { return comms_[size_t(d)]; }
  /// Polls every communicator's asynchronous error; on an error aborts them all (ncclCommAbort)
  /// and the job (exit 3), naming `what` and the dimension. For the CUDA backend's watchdog.
  void check_async_errors(const char* what);

 private:
  void wait_ready(ncclComm_t comm, const char* what, const char* dim);
  ncclComm_t world_ = nullptr;
  std::array<ncclComm_t, kNumMeshDims> comms_{};
  double timeout_s_;
};

}  // namespace meshtrain
