#include "layout/rank_layout.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>
#include <sstream>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

// Mesh axes (MeshCoord indices) that make up each dimension.
const std::vector<int>& axes_of(MeshDim d) {
  // ep and efsdp split the fsdp axes (dp_shard, cp) by key: RankLayout::color / key.
  static const std::vector<int> table[kNumMeshDims] = {{0}, {1}, {2}, {3}, {4}, {1, 2}, {2, 3}, {1, 2, 3}, {2, 3}, {2, 3}};
  return table[int(d)];
}

}  // namespace

const char* mesh_dim_name(MeshDim d) {
  static const char* names[] = {"pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "fsdp", "loss", "ep", "efsdp"};
  return names[int(d)];
}

std::array<int64_t, 5> RankLayout::degrees() const {
  return {dims_.pp, dims_.dp_replicate, dims_.dp_shard, dims_.cp, dims_.tp};
}

RankLayout::RankLayout(const ParallelDims& dims, std::vector<RankPlace> places, bool allow_cross_node_tp)
    : dims_(dims), places_(std::move(places)) {
  const int64_t world = int64_t(places_.size());
  if (dims.world() != world)
    throw ConfigError("layout: pp × dp_replicate × dp_shard × cp × tp = " + std::to_string(dims.world()) +
                      " but there are " + std::to_string(world) + " ranks");
  std::vector<int64_t> order(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) order[size_t(r)] = r;
  // Whatever order the launcher numbered the ranks in, place by physical position.
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const RankPlace &x = places_[size_t(a)], &y = places_[size_t(b)];
    return std::tie(x.rack, x.node, x.local_rank, x.rank) < std::tie(y.rack, y.node, y.local_rank, y.rank);
  });
  const auto deg = degrees();
  coords_.resize(size_t(world));
  for (int64_t p = 0; p < world; ++p) {
    MeshCoord c{};
    int64_t rest = p;
    for (int axis = 4; axis >= 0; --axis) {
      c[size_t(axis)] = rest % deg[size_t(axis)];
      rest /= deg[size_t(axis)];
    }
    coords_[size_t(order[size_t(p)])] = c;
  }
  rank_at_.resize(size_t(world));
  for (int64_t p = 0; p < world; ++p) rank_at_[size_t(p)] = order[size_t(p)];
  if (!allow_cross_node_tp && dims.tp > 1) {
    // One pass: the first node of each tp group, and the first member that lives elsewhere.
    std::vector<int64_t> first(size_t(world / dims.tp), -1);
    for (int64_t r = 0; r < world; ++r) {
      int64_t& f = first[size_t(color(MeshDim::kTP, r))];
      if (f < 0) f = r;
      if (places_[size_t(f)].node != places_[size_t(r)].node)
        throw ConfigError("layout: tensor-parallel group " + std::to_string(color(MeshDim::kTP, r)) + " (tp " +
                          std::to_string(dims.tp) + ") spans nodes " + places_[size_t(f)].host + " and " +
                          places_[size_t(r)].host +
                          "; tp must stay inside a node (set [topology] allow_cross_node_tp = true to allow it)");
    }
  }
}

int64_t RankLayout::pp_prev(int64_t rank) const {
  // Coordinates were assigned in placement order with pp outermost: stage ± 1 is ± world/pp.
  const int64_t stride = world() / dims_.pp;
  const int64_t pos = key(MeshDim::kPP, rank) * stride + color(MeshDim::kPP, rank);
  return coords_[size_t(rank)][0] == 0 ? -1 : rank_at_[size_t(pos - stride)];
}

int64_t RankLayout::pp_next(int64_t rank) const {
  const int64_t stride = world() / dims_.pp;
  const int64_t pos = key(MeshDim::kPP, rank) * stride + color(MeshDim::kPP, rank);
  return coords_[size_t(rank)][0] + 1 == dims_.pp ? -1 : rank_at_[size_t(pos + stride)];
}

int64_t RankLayout::color(MeshDim d, int64_t rank) const {
  if (d == MeshDim::kEP || d == MeshDim::kEFSDP) {
    const int64_t ep = std::max<int64_t>(dims_.ep, 1), f = key(MeshDim::kFSDP, rank);
    const int64_t outer = color(MeshDim::kFSDP, rank);
    return d == MeshDim::kEP ? outer * (dims_.dp_shard * dims_.cp / ep) + f / ep : outer * ep + f % ep;
  }
  const auto& in = axes_of(d);
  const auto deg = degrees();
  const MeshCoord& c = coords_[size_t(rank)];
  int64_t v = 0;
  for (int axis = 0; axis < 5; ++axis)
    if (std::find(in.begin(), in.end(), axis) == in.end()) v = v * deg[size_t(axis)] + c[size_t(axis)];
  return v;
}

int64_t RankLayout::key(MeshDim d, int64_t rank) const {
  if (d == MeshDim::kEP || d == MeshDim::kEFSDP) {
    const int64_t ep = std::max<int64_t>(dims_.ep, 1), f = key(MeshDim::kFSDP, rank);
    return d == MeshDim::kEP ? f % ep : f / ep;
  }
  const auto deg = degrees();
  const MeshCoord& c = coords_[size_t(rank)];
  int64_t v = 0;
  for (int axis : axes_of(d)) v = v * deg[size_t(axis)] + c[size_t(axis)];
  return v;
}

std::vector<int64_t> RankLayout::group(MeshDim d, int64_t rank) const {
  const int64_t col = color(d, rank);
  std::vector<std::pair<int64_t, int64_t>> members;
  for (int64_t r = 0; r < world(); ++r)
    if (color(d, r) == col) members.emplace_back(key(d, r), r);
  std::sort(members.begin(), members.end());
  std::vector<int64_t> out;
  for (const auto& [k, r] : members) out.push_back(r);
  return out;
}

GroupSpan RankLayout::span(MeshDim d) const {
  GroupSpan s;
  s.size = 1;
  for (int axis : axes_of(d)) s.size *= degrees()[size_t(axis)];
  const int64_t ep = std::max<int64_t>(dims_.ep, 1);
  if (d == MeshDim::kEP) s.size = ep;
  if (d == MeshDim::kEFSDP) s.size /= ep;
  s.groups = world() / s.size;
  // One pass: the first node and rack seen per group, and whether any member differs.
  std::vector<int64_t> node(size_t(s.groups), -1), rack(size_t(s.groups), -1);
  std::vector<char> multi_node(size_t(s.groups), 0), multi_rack(size_t(s.groups), 0);
  for (int64_t r = 0; r < world(); ++r) {
    const size_t g = size_t(color(d, r));
    const RankPlace& p = places_[size_t(r)];
    if (node[g] < 0) node[g] = p.node, rack[g] = p.rack;
    multi_node[g] |= node[g] != p.node;
    multi_rack[g] |= rack[g] != p.rack;
  }
  for (size_t g = 0; g < node.size(); ++g) {
    s.cross_node += multi_node[g];
    s.cross_rack += multi_rack[g];
  }
  s.widest = s.cross_rack ? Tier::kSpine : s.cross_node ? Tier::kRack : Tier::kNode;
  return s;
}

std::string layout_report(const RankLayout& l) {
  std::ostringstream out;
  std::set<int64_t> nodes, racks;
  for (int64_t r = 0; r < l.world(); ++r) nodes.insert(l.place(r).node), racks.insert(l.place(r).rack);
  out << "world " << l.world() << " ranks, " << nodes.size() << " node(s), " << racks.size() << " rack(s)\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-14s %6s %8s %-7s %12s %12s\n", "dimension", "size", "groups", "widest",
                "cross-node", "cross-rack");
  out << buf;
  for (int d = 0; d < kNumMeshDims; ++d) {
    const GroupSpan s = l.span(MeshDim(d));
    std::snprintf(buf, sizeof buf, "%-14s %6lld %8lld %-7s %12lld %12lld\n", mesh_dim_name(MeshDim(d)),
                  (long long)s.size, (long long)s.groups, tier_name(s.widest), (long long)s.cross_node,
                  (long long)s.cross_rack);
    out << buf;
  }
  return out.str();
}

std::string layout_csv(const RankLayout& l) {
  std::ostringstream out;
  out << "rank,host,node,rack,local_rank,pp,dp_replicate,dp_shard,cp,tp";
  for (int d = 0; d < kNumMeshDims; ++d) out << "," << mesh_dim_name(MeshDim(d)) << "_group";
  out << ",pp_prev,pp_next\n";
  for (int64_t r = 0; r < l.world(); ++r) {
    const RankPlace& p = l.place(r);
    out << r << "," << p.host << "," << p.node << "," << p.rack << "," << p.local_rank;
    for (int64_t c : l.coord(r)) out << "," << c;
    for (int d = 0; d < kNumMeshDims; ++d) out << "," << l.color(MeshDim(d), r);
    out << "," << l.pp_prev(r) << "," << l.pp_next(r) << "\n";
  }
  return out.str();
}

}  // namespace meshtrain
