#pragma once
/// @file Reassembling tensor-parallel parameters into their global shape on the host (model
/// dumps; the exports and checkpoints of later issues write hyperslabs instead).
#include <vector>

#include "comm/communicator.hpp"
#include "device/device.hpp"
#include "model/parameter.hpp"

namespace meshtrain {

/// The global tensor of `p` (row-major, shape_numel(p.shape) floats on the host) from the
/// tp-local values p.value of every rank of `tp`, which must be bound (after
/// GradientSync::gather_full_parameters). Collective over tp: every rank calls it for the same
/// parameters in the same order. A parameter replicated over tp is downloaded as is.
/// @throws CommError.
std::vector<float> gather_tp_parameter(Device& dev, Communicator& tp, const Parameter& p);

}  // namespace meshtrain
