#pragma once
/// @file ParallelContext: the communicators one training step reduces over, chosen once from the
/// rank layout (DESIGN.md "ParallelContext") so that the trainer and the step schedules never
/// pick a group inline. Host scalars (loss sums, verdicts, metrics) travel on the MPI
/// communicators; tensors on the device communicators (MPI on the cpu device, NCCL or host-staged
/// MPI on GPUs, train/device_comms.hpp).
///
///   group        dimension(s)                 what is reduced over it
///   world        every rank                   the non-finite verdict and preemption flag (one
///                                             all-reduce per step), largest-rank metrics,
///                                             checkpoint agreement
///   data         dp_replicate × dp_shard      which samples this rank reads (train and validation;
///                                             cp ranks read the same ones)
///   loss         dp_replicate × dp_shard × cp the step's loss sum (global target-token mean) and
///                                             the validation loss sums
///   tp           tp                           tensor-parallel layers, replicated parameters'
///                                             partial gradients, the gradient norm over slabs
///   cp           cp                           ring / all-gather / Ulysses attention (device)
///   fsdp         dp_shard × cp                FSDP / ZeRO sharding (parameters, gradients, AdamW)
///   dp_replicate dp_replicate                 DDP buckets, HSDP's all-reduce of shards
///   pp           pp                           activations and their gradients between stages
///                                             (device); the loss and the gradient norm's sum over
///                                             stages, the validation sums (host)
#include "comm/mesh_communicators.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "train/device_comms.hpp"

namespace meshtrain {

struct ParallelContext {
  MpiCommunicator* world = nullptr;
  Communicator* data = nullptr;          ///< host (MPI), MeshDim::kDP
  Communicator* loss = nullptr;          ///< host (MPI), MeshDim::kLoss
  Communicator* tp = nullptr;            ///< device, MeshDim::kTP
  Communicator* cp = nullptr;            ///< device, MeshDim::kCP
  Communicator* fsdp = nullptr;          ///< device, MeshDim::kFSDP
  Communicator* ep = nullptr;            ///< device, MeshDim::kEP: the MoE token exchange
  Communicator* efsdp = nullptr;         ///< device, MeshDim::kEFSDP: the experts' sharding group
  Communicator* dp_replicate = nullptr;  ///< device, MeshDim::kDpReplicate
  Communicator* pp = nullptr;            ///< host (MPI), MeshDim::kPP
  Communicator* pp_device = nullptr;     ///< device, MeshDim::kPP

  /// Whether this rank writes checkpoint pieces replicated over dp_replicate (its rank 0 does).
  bool dp_primary() const { return dp_replicate->rank() == 0; }
  /// Whether this rank writes parameters replicated over tp (tp rank 0 does).
  bool tp_primary() const { return tp->rank() == 0; }
};

/// The context of this rank: host groups from `host`, device groups from `device` (both split
/// from the same layout). Throws nothing; the communicators must outlive the context.
inline ParallelContext make_parallel_context(MpiCommunicator& world, MeshCommunicators& host, DeviceComms& device) {
  ParallelContext c;
  c.world = &world;
  c.data = &host.get(MeshDim::kDP);
  c.loss = &host.get(MeshDim::kLoss);
  c.tp = &device.get(MeshDim::kTP);
  c.cp = &device.get(MeshDim::kCP);
  c.fsdp = &device.get(MeshDim::kFSDP);
  c.ep = &device.get(MeshDim::kEP);
  c.efsdp = &device.get(MeshDim::kEFSDP);
  c.dp_replicate = &device.get(MeshDim::kDpReplicate);
  c.pp = &host.get(MeshDim::kPP);
  c.pp_device = &device.get(MeshDim::kPP);
  return c;
}

}  // namespace meshtrain
