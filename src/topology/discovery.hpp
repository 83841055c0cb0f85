#pragma once
/// @file Topology discovery at start-up: every rank learns its host and local rank through MPI
/// and every rank's racks from the first source given: [topology] file (Slurm topology.conf),
/// SLURM_TOPOLOGY_ADDR + SLURM_TOPOLOGY_ADDR_PATTERN, [topology] nodes_per_rack, else one rack.
/// With [topology] simulate = true, ranks are placed on synthetic nodes of ranks_per_node
/// (tests and single-host rehearsals of multi-node layouts).
#include <mpi.h>

#include <vector>

#include "config/job_config.hpp"
#include "topology/topology.hpp"

namespace meshtrain {

/// Collective over `world`: the place of every rank, identical on all ranks (world rank order).
/// `topo` is the parsed [topology] file (empty when none); it is parsed before this call so
/// that no rank can fail between collectives.
/// @throws ConfigError for a host missing from the topology, after all collectives (same on
///         every rank, since every rank sees the same host list).
std::vector<RankPlace> discover_places(MPI_Comm world, const TopologySection& cfg, Topology topo);

}  // namespace meshtrain
