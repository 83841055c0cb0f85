#include "optim/muon_plan.hpp"

#include <limits>
#include <stdexcept>

#include "optim/newton_schulz.hpp"
#include "parallel/fsdp/dim0_shard.hpp"

namespace meshtrain {

namespace {

/// The tp-local shape of `p` on tp rank t (p.local_shape is this rank's).
Shape local_shape_on(const Parameter& p, int64_t t, int64_t tp) {
  Shape s = p.local_shape;
  const int d = p.sharding.tp_dim;
  if (d >= 0 && tp > 1) s[size_t(d)] = chunk_range(p.shape[size_t(d)], tp, t).second;
  return s;
}

}  // namespace

int64_t MuonMatrix::local_rows(int64_t t, int64_t tp) const {
  return tp_split == 0 && tp > 1 ? chunk_range(rows, tp, t).second : rows;
}

int64_t MuonMatrix::local_cols(int64_t t, int64_t tp) const {
  return tp_split == 1 && tp > 1 ? chunk_range(cols, tp, t).second : cols;
}

int64_t MuonMatrix::slab_first(int64_t t, int64_t tp) const {
  if (tp_split < 0 || tp == 1) return 0;
  return chunk_range(tp_split == 0 ? rows : cols, tp, t).first;
}

bool muon_orthogonalizes(const Parameter& p) {
  return p.shape.size() >= 2 && p.name != "tok_embeddings.weight" && p.name != "output.weight";
}

ElemRange shard_elements(const Shape& local_shape, int64_t group, int64_t k) {
  if (group == 1) return {0, shape_numel(local_shape)};
  const Dim0Shard s = dim0_shard(local_shape, group, k);
  return {s.first_row * s.row_elems, s.local_elems()};
}

ElemRange intersect(ElemRange a, ElemRange b) {
  const int64_t lo = std::max(a.first, b.first), hi = std::min(a.first + a.count, b.first + b.count);
  return hi > lo ? ElemRange{lo, hi - lo} : ElemRange{lo, 0};
}

std::vector<MuonMatrix> plan_muon_matrices(const std::vector<const Parameter*>& params, const std::vector<int>& group_of,
                                           const std::vector<MuonGroupInfo>& groups, int64_t tp, int ns_steps) {
  std::vector<MuonMatrix> out;
  // Newton–Schulz flops dealt so far to each (shard rank, tp rank) of each group.
  std::vector<std::vector<double>> load(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) load[g].assign(size_t(groups[g].size * tp), 0.0);
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    if (!p) continue;
    const int g = group_of.at(i);
    const MuonGroupInfo& grp = groups.at(size_t(g));
    const size_t nd = p->shape.size();
    const int d = tp > 1 ? p->sharding.tp_dim : -1;
    MuonMatrix base;
    base.shard = i;
    base.group = g;
    int64_t experts = 0;
    if (nd == 2) {
      base.rows = p->shape[0];
      base.cols = p->shape[1];
      base.tp_split = d;
    } else if (nd == 3) {  // routed experts [E, a, b], each expert a matrix of its own
      if (d == 0)
        throw std::invalid_argument(p->name + ": Muon cannot orthogonalize experts split over tp (tp_dim 0)");
      base.rows = p->shape[1];
      base.cols = p->shape[2];
      base.tp_split = d < 0 ? -1 : d - 1;
      experts = p->local_shape[0];
    } else {
      throw std::invalid_argument(p->name + ": Muon orthogonalizes 2-D weights and [E, a, b] experts, not " +
                                  shape_str(p->shape));
    }
    const Shape shape0 = local_shape_on(*p, 0, tp);  // what every rank decides from: tp rank 0's layout
    for (int64_t e = (nd == 3 ? 0 : -1); e < (nd == 3 ? experts : 0); ++e) {
      MuonMatrix m = base;
      m.expert = e;
      const ElemRange unit{m.offset(0, tp), m.local_elems(0, tp)};
      int whole = -1;  // a shard rank holding the whole matrix keeps it
      for (int64_t k = 0; k < grp.size && whole < 0; ++k)
        if (intersect(shard_elements(shape0, grp.size, k), unit).count == unit.count) whole = int(k);
      const double cost = newton_schulz_flops(m.rows, m.cols, ns_steps);
      double best = std::numeric_limits<double>::infinity();
      for (int64_t s = (whole < 0 ? 0 : whole); s < (whole < 0 ? grp.size : whole + 1); ++s)
        for (int64_t t = 0; t < tp; ++t)
          if (load[size_t(g)][size_t(s * tp + t)] < best) {
            best = load[size_t(g)][size_t(s * tp + t)];
            m.s_owner = int(s);
            m.t_owner = int(t);
          }
      load[size_t(g)][size_t(m.s_owner * tp + m.t_owner)] += cost;
      out.push_back(m);
    }
  }
  return out;
}

}  // namespace meshtrain
