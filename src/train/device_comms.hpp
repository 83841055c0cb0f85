#pragma once
/// @file DeviceComms: the communicator of each mesh dimension for collectives on device tensors
/// (DESIGN.md data flow step 4). On the cpu device these are the MPI communicators themselves.
/// On cuda: NCCL communicators, one per dimension split from a world NCCL communicator, when
/// every rank of each node has a GPU of its own; otherwise — several ranks sharing one GPU
/// (NCCL 2.28 cannot host two ranks on one GPU, so single-GPU tests of TP / FSDP take this
/// path) or a build without NCCL — MPI with the device buffers staged through host memory.
/// Host scalars (losses, norms, token counts) always go over MPI.
#include <array>
#include <memory>
#include <string>

#include "comm/mesh_communicators.hpp"
#include "device/device.hpp"

namespace meshtrain {

class DeviceComms {
 public:
  /// Collective over `world` (every rank picks the same backend). `init_timeout_s` bounds NCCL
  /// communicator creation. @throws CommError when NCCL initialization fails.
  DeviceComms(MeshCommunicators& mpi, Device& dev, const MpiCommunicator& world, const RankLayout& layout,
              double init_timeout_s);
  ~DeviceComms();
  DeviceComms(const DeviceComms&) = delete;
  DeviceComms& operator=(const DeviceComms&) = delete;

  /// The communicator for device tensors of this rank's group in dimension d.
  Communicator& get(MeshDim d);
  /// Deadline (seconds) of every later collective on the non-MPI communicators (the MPI ones
  /// follow MeshCommunicators::set_timeout).
  void set_timeout(double seconds);
  /// "mpi", "nccl" or "mpi (host-staged)", for the run log.
  const std::string& backend() const { return backend_; }

 private:
  struct Nccl;  // the NCCL mesh and communicators (CUDA builds only)
  MeshCommunicators& mpi_;
  std::array<std::unique_ptr<Communicator>, kNumMeshDims> own_;
  std::unique_ptr<Nccl> nccl_;
  std::string backend_ = "mpi";
};

}  // namespace meshtrain
