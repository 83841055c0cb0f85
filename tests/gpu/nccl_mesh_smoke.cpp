// GPU smoke test of NcclMesh: one rank on one GPU creates the world NCCL communicator and one per
// mesh dimension (all of size 1). Exits 77 (ctest SKIPPED) when no GPU is present.
#include <cuda_runtime.h>

#include <cstdio>

#include "comm/nccl/nccl_mesh.hpp"
#include "comm/mpi/mpi_communicator.hpp"

using namespace meshtrain;

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  MpiRuntime mpi(&argc, &argv);
  cudaSetDevice(0);
  ParallelDims d;
  const RankLayout layout(d, synthetic_places(1, 1, 0, Topology()));
  NcclMesh mesh(MPI_COMM_WORLD, layout, 60.0);
  for (int i = 0; i < kNumMeshDims; ++i) {
    int count = 0;
    ncclCommCount(mesh.get(MeshDim(i)), &count);
    if (count != 1) {
      std::fprintf(stderr, "dimension %s has %d ranks, expected 1\n", mesh_dim_name(MeshDim(i)), count);
      return 1;
    }
  }
  mesh.check_async_errors("smoke");
  std::printf("NCCL world + %d dimension communicators created\n", kNumMeshDims);
  return 0;
}
