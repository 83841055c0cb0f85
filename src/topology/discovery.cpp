#include "topology/discovery.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

// Every rank's copy of a short string, gathered in rank order.
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  int len = int(mine.size()), max_len = 0;
  MPI_Allreduce(&len, &max_len, 1, MPI_INT, MPI_MAX, comm);
  std::vector<char> send(size_t(max_len) + 1, '\0'), recv(size_t(max_len + 1) * size_t(size));
  std::memcpy(send.data(), mine.data(), mine.size());
  MPI_Allgather(send.data(), max_len + 1, MPI_CHAR, recv.data(), max_len + 1, MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.emplace_back(recv.data() + size_t(r) * size_t(max_len + 1));
  return out;
}

}  // namespace

std::vector<RankPlace> discover_places(MPI_Comm world, const TopologySection& cfg, Topology topo) {
  int size = 0;
  MPI_Comm_size(world, &size);
  if (cfg.simulate) {
    return synthetic_places(size, cfg.ranks_per_node, cfg.nodes_per_rack, topo, topo.hosts());
  }
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  // Ranks sharing memory are one node even if processor names were to differ (containers).
  MPI_Comm node_comm;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_comm);
  int node_leader = 0, world_rank = 0;
  MPI_Comm_rank(world, &world_rank);
  int local = 0;
  MPI_Comm_rank(node_comm, &local);
  node_leader = world_rank;
  MPI_Bcast(&node_leader, 1, MPI_INT, 0, node_comm);  // lowest world rank of the node names it
  MPI_Comm_free(&node_comm);
  const auto names = allgather_strings(world, std::string(name, size_t(len)));
  std::vector<std::string> host_of_rank(static_cast<size_t>(size));
  std::vector<int> leaders(static_cast<size_t>(size));
  MPI_Allgather(&node_leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world);
  for (int r = 0; r < size; ++r) host_of_rank[size_t(r)] = names[size_t(leaders[size_t(r)])];
  const char* addr = std::getenv("SLURM_TOPOLOGY_ADDR");
  const char* pattern = std::getenv("SLURM_TOPOLOGY_ADDR_PATTERN");
  if (topo.empty() && addr && pattern) {
    const auto addrs = allgather_strings(world, addr);
    for (int r = 0; r < size; ++r) topo.add_slurm_address(host_of_rank[size_t(r)], addrs[size_t(r)], pattern);
  }
  return places_from_hosts(host_of_rank, topo, cfg.nodes_per_rack);
}

}  // namespace meshtrain
