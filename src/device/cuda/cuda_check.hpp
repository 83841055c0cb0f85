#pragma once
/// @file Error checks of CUDA runtime and cuBLASLt calls: a failed call throws
/// std::runtime_error naming the call, the file:line and CUDA's error string.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace meshtrain::cuda {

/// @throws std::runtime_error("CUDA error in <what> (<file>:<line>): <string>") unless ok.
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                             "): " + cudaGetErrorString(e));
}
/// @throws std::runtime_error naming the cuBLASLt call and its status.
inline void check(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt error in ") + what + " (" + file + ":" + std::to_string(line) +
                             "): status " + std::to_string(int(s)));
}

}  // namespace meshtrain::cuda

#define MT_CUDA(call) ::meshtrain::cuda::check((call), #call, __FILE__, __LINE__)
/// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define MT_CUDA_LAUNCH(what) ::meshtrain::cuda::check(cudaGetLastError(), what, __FILE__, __LINE__)
