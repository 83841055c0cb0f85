// Watchdog probe: rank 1 never joins the all-reduce (it sleeps), so rank 0's collective must
// miss its 2 s deadline, print which collective on which group, and abort the job with exit 3.
#include <chrono>
#include <thread>

#include "comm/mpi/mpi_communicator.hpp"

using namespace meshtrain;

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  world.set_timeout(2.0);
  if (mpi.world_rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  double x = 1.0;
  world.all_reduce_host(&x, 1, ReduceOp::kSum);
  return 0;  // not reached: the deadline aborts the job
}
