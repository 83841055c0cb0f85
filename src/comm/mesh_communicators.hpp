#pragma once
/// @file One communicator per mesh dimension and derived group (DESIGN.md data flow step 4),
/// split from the world with the layout's colors and keys, so communicator rank == layout key.
#include <array>
#include <memory>

#include "comm/mpi/mpi_communicator.hpp"
#include "layout/rank_layout.hpp"

namespace meshtrain {

class MeshCommunicators {
 public:
  /// Collective over `world`: MPI_Comm_split per dimension (pp, dp_replicate, dp_shard, cp, tp,
  /// dp, fsdp, loss). @throws CommError when a split fails.
  MeshCommunicators(const MpiCommunicator& world, const RankLayout& layout);
  /// The communicator of this rank's group in dimension d (named after the dimension).
  MpiCommunicator& get(MeshDim d) { return *comms_[size_t(d)]; }
  /// Deadline (seconds) of every later collective on every dimension (watchdog).
  void set_timeout(double seconds) {
    for (auto& c : comms_) c->set_timeout(seconds);
  }

 private:
  std::array<std::unique_ptr<MpiCommunicator>, kNumMeshDims> comms_;
};

}  // namespace meshtrain
