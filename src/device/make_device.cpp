#include <omp.h>

#include <cstdlib>
#include <stdexcept>

#include "device/cpu/cpu_device.hpp"
#include "device/device.hpp"
#ifdef MESHTRAIN_HAVE_CUDA
#include <cuda_runtime.h>

#include "device/cuda/cuda_device.hpp"
#endif

namespace meshtrain {

int cuda_device_count() {
#ifdef MESHTRAIN_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no GPU: not sticky, clear it
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

bool cuda_build() {
#ifdef MESHTRAIN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Device> make_device(const std::string& kind, int threads, int gpu) {
  if (kind == "cpu") {
    if (threads <= 0) {
      const char* env = std::getenv("OMP_NUM_THREADS");
      threads = env && std::atoi(env) > 0 ? std::atoi(env) : omp_get_num_procs();
    }
    return std::make_unique<CpuDevice>(threads);
  }
  if (kind == "cuda") {
#ifdef MESHTRAIN_HAVE_CUDA
    const int n = cuda_device_count();
    if (n == 0) throw std::runtime_error("device 'cuda': no CUDA GPU is visible to this process (CUDA_VISIBLE_DEVICES, driver)");
    return std::make_unique<CudaDevice>(gpu % n);
#else
    throw std::invalid_argument("device 'cuda': this meshtrain was built without CUDA (MESHTRAIN_CUDA=OFF or no toolkit found)");
#endif
  }
  throw std::invalid_argument("device '" + kind + "' is not implemented (cpu, cuda)");
}

}  // namespace meshtrain
