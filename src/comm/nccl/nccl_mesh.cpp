#include "comm/nccl/nccl_mesh.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_communicator.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

void check(ncclResult_t r, const char* what, const char* dim) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw CommError(std::string(what) + " on dimension '" + dim + "' failed: " + ncclGetErrorString(r));
}

[[noreturn]] void abort_all(const char* what, const char* dim, const char* why) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "[rank %d] watchdog: NCCL %s on dimension '%s' %s; aborting the job\n", rank, what, dim, why);
  std::fflush(stderr);
  MpiRuntime::abort_job(kExitComm);
}

}  // namespace

void NcclMesh::wait_ready(ncclComm_t comm, const char* what, const char* dim) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError", dim);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      ncclCommAbort(comm);
      abort_all(what, dim, ncclGetErrorString(state));
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s_) {
      ncclCommAbort(comm);
      abort_all(what, dim, "did not complete within the init deadline");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

NcclMesh::NcclMesh(MPI_Comm world, const RankLayout& layout, double timeout_s) : timeout_s_(timeout_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  ncclUniqueId id;
  if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId", "world");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // non-blocking: the watchdog can abort a hung initialization
  check(ncclCommInitRankConfig(&world_, size, id, rank, &config), "ncclCommInitRankConfig", "world");
  wait_ready(world_, "ncclCommInitRankConfig", "world");
  for (int d = 0; d < kNumMeshDims; ++d) {
    const MeshDim dim = MeshDim(d);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    // The same colors and keys as the MPI communicators, so both sides agree on every group.
    check(ncclCommSplit(world_, int(layout.color(dim, rank)), int(layout.key(dim, rank)), &comms_[size_t(d)], &cfg),
          "ncclCommSplit", mesh_dim_name(dim));
    // A non-blocking split runs as a job of the parent: NCCL writes the child's handle only
    // when the job completes (NULL until then), so the parent is polled, then the child.
    wait_ready(world_, "ncclCommSplit", mesh_dim_name(dim));
    if (comms_[size_t(d)] == nullptr)
      throw CommError(std::string("ncclCommSplit on dimension '") + mesh_dim_name(dim) +
                      "' completed without a communicator");
    wait_ready(comms_[size_t(d)], "ncclCommSplit", mesh_dim_name(dim));
  }
}

void NcclMesh::check_async_errors(const char* what) {
  for (int d = 0; d < kNumMeshDims; ++d) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comms_[size_t(d)], &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      for (ncclComm_t c : comms_) ncclCommAbort(c);
      abort_all(what, mesh_dim_name(MeshDim(d)), ncclGetErrorString(state));
    }
  }
}

NcclMesh::~NcclMesh() {
  // Dimension communicators before the world they were split from.
  std::vector<std::pair<ncclComm_t, const char*>> all;
  for (int d = 0; d < kNumMeshDims; ++d)
    if (comms_[size_t(d)]) all.push_back({comms_[size_t(d)], mesh_dim_name(MeshDim(d))});
  if (world_) all.push_back({world_, "world"});
  // Non-blocking communicators: ncclCommFinalize only starts the flush (state ncclInProgress),
  // and ncclCommDestroy before the state left ncclInProgress would free resources NCCL still
  // uses. Every finalize is issued first, so they progress together whatever order the peers
  // finalize in; then each is polled. One that fails or outlives the deadline (a dead peer
  // never reaches quiescence) is aborted instead, so a destructor never hangs.
  std::vector<bool> finalizing(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const ncclResult_t r = ncclCommFinalize(all[i].first);
    finalizing[i] = r == ncclSuccess || r == ncclInProgress;
  }
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < all.size(); ++i) {
    auto [comm, dim] = all[i];
    ncclResult_t state = finalizing[i] ? ncclInProgress : ncclInternalError;
    while (state == ncclInProgress) {
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
      if (state != ncclInProgress) break;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s_) {
        std::fprintf(stderr, "NCCL communicator of dimension '%s' did not finalize within %.0f s; aborting it\n", dim,
                     timeout_s_);
        state = ncclInternalError;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (state == ncclSuccess) (void)ncclCommDestroy(comm);
    else (void)ncclCommAbort(comm);
  }
}

}  // namespace meshtrain
