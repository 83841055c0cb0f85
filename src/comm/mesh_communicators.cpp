#include "comm/mesh_communicators.hpp"

namespace meshtrain {

MeshCommunicators::MeshCommunicators(const MpiCommunicator& world, const RankLayout& layout) {
  const int64_t me = world.rank();
  for (int d = 0; d < kNumMeshDims; ++d) {
    const MeshDim dim = MeshDim(d);
    comms_[size_t(d)] = world.split(int(layout.color(dim, me)), int(layout.key(dim, me)), mesh_dim_name(dim));
  }
}

}  // namespace meshtrain
