#include "train/device_comms.hpp"

#include <mpi.h>

#include <set>
#include <utility>

#include "comm/staged_communicator.hpp"
#include "util/errors.hpp"
#ifdef MESHTRAIN_HAVE_NCCL
#include "comm/nccl/nccl_communicator.hpp"
#include "comm/nccl/nccl_mesh.hpp"
#include "device/cuda/cuda_device.hpp"
#endif

namespace meshtrain {

struct DeviceComms::Nccl {
#ifdef MESHTRAIN_HAVE_NCCL
  std::unique_ptr<NcclMesh> mesh;
#endif
};

#ifdef MESHTRAIN_HAVE_NCCL
namespace {

/// Whether every rank of this rank's node can have a GPU of its own (node-local ranks ≤ visible
/// GPUs), agreed over the world so all ranks choose the same backend.
bool one_gpu_per_rank(const MpiCommunicator& world, const RankLayout& layout) {
  const int64_t node = layout.place(world.rank()).node;
  int64_t on_node = 0;
  for (int64_t r = 0; r < layout.world(); ++r) on_node += layout.place(r).node == node;
  int ok = on_node <= cuda_device_count() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world.comm());
  return ok == 1;
}

}  // namespace
#endif

DeviceComms::DeviceComms(MeshCommunicators& mpi, Device& dev, const MpiCommunicator& world, const RankLayout& layout,
                         double init_timeout_s)
    : mpi_(mpi), nccl_(std::make_unique<Nccl>()) {
  if (dev.host_address(dev.empty({1}, DType::kF32, MemCategory::kTemporaries)) != nullptr) return;  // host memory: MPI
#ifdef MESHTRAIN_HAVE_NCCL
  auto* cuda = dynamic_cast<CudaDevice*>(&dev);
  if (cuda && one_gpu_per_rank(world, layout)) {
    nccl_->mesh = std::make_unique<NcclMesh>(world.comm(), layout, init_timeout_s);
    for (int d = 0; d < kNumMeshDims; ++d)
      own_[size_t(d)] = std::make_unique<NcclCommunicator>(nccl_->mesh->get(MeshDim(d)), *cuda,
                                                           mpi_.get(MeshDim(d)), mesh_dim_name(MeshDim(d)));
    backend_ = "nccl";
    return;
  }
#else
  (void)world, (void)layout, (void)init_timeout_s;
#endif
  for (int d = 0; d < kNumMeshDims; ++d) own_[size_t(d)] = std::make_unique<StagedCommunicator>(mpi_.get(MeshDim(d)), dev);
  backend_ = "mpi (host-staged)";
}

DeviceComms::~DeviceComms() {
  for (auto& c : own_) c.reset();  // communicators before the NCCL mesh they use
  nccl_.reset();
}

Communicator& DeviceComms::get(MeshDim d) {
  if (own_[size_t(d)]) return *own_[size_t(d)];
  return mpi_.get(d);
}

void DeviceComms::set_timeout(double seconds) {
#ifdef MESHTRAIN_HAVE_NCCL
  for (auto& c : own_)
    if (auto* n = dynamic_cast<NcclCommunicator*>(c.get())) n->set_timeout(seconds);
#else
  (void)seconds;
#endif
}

}  // namespace meshtrain
