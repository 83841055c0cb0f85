#pragma once
/// @file NvtxStepRange: an NVTX push / pop range (NVIDIA Tools Extension, the header-only nvtx3
/// of the CUDA toolkit) named after a training step, in builds with the CUDA backend; nothing
/// otherwise. Without a tool attached a push / pop costs a few nanoseconds; with Nsight Systems
/// the steps show as ranges on the timeline, and Nsight Compute can profile the kernels of one
/// step only:  ncu --nvtx --nvtx-include "step 3/" meshtrain train ...  (scripts/gpu-session.sh's
/// kernels step). The range must end on the thread that began it (the trainer's).
#include <string>

#ifdef MESHTRAIN_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace meshtrain {

class NvtxStepRange {
 public:
  /// Opens the range `name` (e.g. "step 3"). Throws nothing.
  explicit NvtxStepRange(const std::string& name) {
#ifdef MESHTRAIN_HAVE_CUDA
    nvtxRangePushA(name.c_str());
#else
    (void)name;
#endif
  }
  /// Closes it. Throws nothing.
  ~NvtxStepRange() {
#ifdef MESHTRAIN_HAVE_CUDA
    nvtxRangePop();
#endif
  }
  NvtxStepRange(const NvtxStepRange&) = delete;
  NvtxStepRange& operator=(const NvtxStepRange&) = delete;
};

}  // namespace meshtrain
