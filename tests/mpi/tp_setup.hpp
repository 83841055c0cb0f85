#pragma once
// A tensor-parallel group for MPI tests of the layers (test_tensor_parallel, test_chunked_loss).
#include <memory>

#include "comm/mpi/mpi_communicator.hpp"
#include "device/device.hpp"
#include "model/tensor_parallel.hpp"

namespace meshtrain::testing {

/// The tp group of `size` ranks this rank belongs to (consecutive world ranks, as the layout
/// places tp innermost).
inline std::unique_ptr<MpiCommunicator> tp_group(const MpiCommunicator& world, int size) {
  return world.split(world.rank() / size, world.rank(), "tp");
}

/// One test's tp group of `size` ranks, its context and a CPU device (one thread).
struct TpSetup {
  MpiCommunicator world{MPI_COMM_WORLD, "world"};
  std::unique_ptr<MpiCommunicator> comm;
  TensorParallel tp;
  std::unique_ptr<Device> dev = make_device("cpu", 1);
  TpSetup(int size, bool sequence_parallel, bool loss_parallel) : comm(tp_group(world, size)) {
    tp.comm = comm.get();
    tp.size = comm->size();
    tp.rank = comm->rank();
    tp.sequence_parallel = sequence_parallel;
    tp.loss_parallel = loss_parallel;
  }
};

}  // namespace meshtrain::testing
