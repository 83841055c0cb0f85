#pragma once
/// @file Expert parallelism as the MoE layers see it: the ep group (ranks borrowed from the fsdp
/// group, layout/rank_layout.hpp MeshDim::kEP) whose ranks hold different experts and exchange
/// tokens with all-to-all (Lepikhin et al. 2021, GShard; TorchTitan's expert_parallel_degree).
#include <cstdint>

#include "comm/communicator.hpp"

namespace meshtrain {

/// The ep group of this rank. With size == 1 every rank holds every expert and comm may be null.
struct ExpertParallel {
  Communicator* comm = nullptr;  ///< the ep group (rank order = ep coordinate)
  int64_t size = 1, rank = 0;
  bool active() const { return size > 1; }
};

}  // namespace meshtrain
