#pragma once
/// @file RankLayout: device-mesh degrees + rank placement → mesh coordinates and groups
/// (DESIGN.md data flow step 3). A pure function of (degrees, topology, rank locations):
/// every rank computes the same layout, and `meshtrain layout` computes it without MPI.
#include <array>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "topology/topology.hpp"

namespace meshtrain {

/// Mesh dimensions (outer to inner) and the derived groups built from them.
enum class MeshDim : int {
  kPP = 0,
  kDpReplicate,
  kDpShard,
  kCP,
  kTP,
  kDP,    ///< dp_replicate × dp_shard: data loading
  kFSDP,  ///< dp_shard × cp: parameter sharding
  kLoss,  ///< dp_replicate × dp_shard × cp: loss and token-count reduction
  /// Expert parallelism, ep ranks borrowed from the fsdp group (TorchTitan's rule: ep divides
  /// dp_shard × cp and does not multiply the world): the ep innermost ranks of each fsdp group
  /// (fsdp key % ep), which hold different experts and exchange tokens.
  kEP,
  kEFSDP,  ///< the rest of the fsdp group (fsdp key / ep): ranks holding the same experts, which shard them
  kCount
};
constexpr int kNumMeshDims = static_cast<int>(MeshDim::kCount);
const char* mesh_dim_name(MeshDim d);  ///< "pp", "dp_replicate", …, "loss", "ep", "efsdp"

/// Coordinates of one rank on the five mesh axes (pp, dp_replicate, dp_shard, cp, tp).
using MeshCoord = std::array<int64_t, 5>;

/// How one dimension's groups sit on the topology.
struct GroupSpan {
  int64_t size = 1;          ///< ranks per group
  int64_t groups = 1;        ///< number of groups
  Tier widest = Tier::kNode; ///< widest tier any group spans
  int64_t cross_node = 0;    ///< groups spanning more than one node
  int64_t cross_rack = 0;    ///< groups spanning more than one rack (over the spine)
};

class RankLayout {
 public:
  /// Orders ranks by (rack, node, local rank) and assigns coordinates in that order with tp
  /// innermost, then cp, dp_shard, dp_replicate, pp: tp groups fill a node, cp and dp_shard
  /// fill the node and then the rack, dp_replicate and pp cross racks.
  /// @throws ConfigError when dims.world() != places.size(), or when a tp group spans nodes and
  ///         allow_cross_node_tp is false (naming the group and the nodes).
  RankLayout(const ParallelDims& dims, std::vector<RankPlace> places, bool allow_cross_node_tp = false);

  int64_t world() const { return int64_t(places_.size()); }
  const ParallelDims& dims() const { return dims_; }
  const RankPlace& place(int64_t rank) const { return places_[size_t(rank)]; }
  const MeshCoord& coord(int64_t rank) const { return coords_[size_t(rank)]; }
  /// Group color of `rank` in dimension d (ranks with equal color form one group, colors are
  /// 0 … groups−1) and its key (position inside the group): the arguments of MPI_Comm_split
  /// and ncclCommSplit.
  int64_t color(MeshDim d, int64_t rank) const;
  int64_t key(MeshDim d, int64_t rank) const;
  /// Ranks of `rank`'s group in dimension d, ordered by key.
  std::vector<int64_t> group(MeshDim d, int64_t rank) const;
  /// Size, count and topology span of dimension d's groups.
  GroupSpan span(MeshDim d) const;
  /// Pipeline neighbours: the rank holding the previous / next stage with the same other
  /// coordinates, −1 for the first / last stage.
  int64_t pp_prev(int64_t rank) const;
  int64_t pp_next(int64_t rank) const;
  /// Degree of each mesh axis in MeshCoord order.
  std::array<int64_t, 5> degrees() const;

 private:
  ParallelDims dims_;
  std::vector<RankPlace> places_;
  std::vector<MeshCoord> coords_;
  std::vector<int64_t> rank_at_;  // rank of each coordinate tuple (row-major over the axes)
};

/// The layout report: for each dimension and derived group, its size, number of groups, the
/// widest tier they span and how many cross each tier (text table).
std::string layout_report(const RankLayout& layout);
/// One CSV line per rank: rank, host, node, rack, local_rank, the five coordinates, the group
/// color of every dimension and the pipeline neighbours (header line first).
std::string layout_csv(const RankLayout& layout);

}  // namespace meshtrain
