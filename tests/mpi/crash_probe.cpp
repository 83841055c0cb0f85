// Dies the way the cluster tests' rare start-up crash did: a call through a null function pointer
// right after MPI_Init. crash_report.sh checks the report names the caller (this file's function).
#include <cstdio>

#include "comm/mpi/mpi_communicator.hpp"

namespace {
using Fn = void (*)();
volatile Fn g_target = nullptr;  // volatile: the compiler must really call through it
}  // namespace

// Not inlined and exported, so dladdr can name it as the caller.
extern "C" __attribute__((noinline, visibility("default"))) void meshtrain_crash_probe_caller() {
  g_target();
  std::puts("unreachable");
}

int main(int argc, char** argv) {
  meshtrain::MpiRuntime mpi(&argc, &argv);
  meshtrain_crash_probe_caller();
  return 0;
}
