#pragma once
/// @file Topology: which node each rank runs on and which top-of-rack switch (rack) each node
/// hangs off, from a Slurm topology.conf (tree plugin), SLURM_TOPOLOGY_ADDR, or a synthetic
/// description (DESIGN.md data flow step 3). Three tiers: node, rack (leaf switch), spine.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace meshtrain {

/// Where one rank runs: its host, the node index and rack index in this topology, and its rank
/// among the ranks of its node.
struct RankPlace {
  int64_t rank = 0;
  std::string host;
  int64_t node = 0;        ///< index into Topology hosts (first-seen order)
  int64_t rack = 0;        ///< index of the leaf switch
  int64_t local_rank = 0;  ///< position among the ranks of the same node
};

/// Communication tiers a group of ranks can span, innermost first.
enum class Tier : int { kNode = 0, kRack = 1, kSpine = 2 };
const char* tier_name(Tier t);

class Topology {
 public:
  /// Everything under one switch (no topology information).
  Topology() = default;

  /// Parses a Slurm topology.conf (tree plugin): lines `SwitchName=S [Switches=hostlist]
  /// [Nodes=hostlist] [LinkSpeed=...]`, `#` comments; also what `scontrol show topology` prints
  /// (with `Level=`, and Nodes= on every switch). Leaf switches (Nodes=, no Switches=) are racks.
  /// @throws ConfigError `FILE:LINE: what is wrong`: malformed line or hostlist, unknown switch
  ///         under Switches=, a node under two leaf switches, a switch with two parents, a cycle,
  ///         or a file that cannot be read.
  static Topology from_slurm_conf(const std::string& path);

  /// From SLURM_TOPOLOGY_ADDR ("s1.s7.nid001") and SLURM_TOPOLOGY_ADDR_PATTERN
  /// ("switch.switch.node") of each host: the switch just above the node is its rack.
  /// @throws ConfigError when the pattern does not end in "node" or the lengths differ.
  void add_slurm_address(const std::string& host, const std::string& addr, const std::string& pattern);

  /// Rack index of `host` (leaf switches in file order). With no information every host is in
  /// rack 0. @throws ConfigError naming `source` when a file was given but lacks the host.
  int64_t rack_of(const std::string& host) const;
  /// Name of rack `index` ("" when there is none).
  std::string rack_name(int64_t index) const;
  bool empty() const { return leaf_of_.empty(); }
  /// Hosts in the order the file lists them (leaf switch by leaf switch).
  const std::vector<std::string>& hosts() const { return hosts_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;                       // file the information came from
  std::map<std::string, int64_t> leaf_of_;   // host -> leaf switch index
  std::vector<std::string> leaves_;          // leaf switch names
  std::vector<std::string> hosts_;           // hosts in file order
};

/// Places `world` simulated ranks: ranks_per_node consecutive ranks per node (hosts named
/// node0000, …, or taken in order from `hosts` when given), nodes_per_rack nodes per rack
/// unless `topo` knows the hosts' racks. Used by `meshtrain layout` and tests (no MPI).
/// @throws ConfigError when `hosts` has too few entries for the ranks.
std::vector<RankPlace> synthetic_places(int64_t world, int64_t ranks_per_node, int64_t nodes_per_rack,
                                        const Topology& topo, const std::vector<std::string>& hosts = {});

/// Places real ranks from their host names (world rank order): node indices by first
/// appearance, local ranks by rank order within a host, racks from `topo` (or nodes_per_rack
/// consecutive nodes per rack when `topo` is empty and nodes_per_rack > 0).
std::vector<RankPlace> places_from_hosts(const std::vector<std::string>& host_of_rank, const Topology& topo,
                                         int64_t nodes_per_rack);

}  // namespace meshtrain
