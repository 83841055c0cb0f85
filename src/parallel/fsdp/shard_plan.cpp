#include "parallel/fsdp/shard_plan.hpp"

#include <algorithm>
#include <stdexcept>

namespace meshtrain {

namespace {
// Rows of rank k's block: [first, first + rows) of the parameter's global rows.
std::pair<int64_t, int64_t> block_rows(const Dim0Shard& s, int64_t k) {
  const int64_t first = std::min(s.rows, k * s.rows_per_rank);
  return {first, std::min(s.rows, first + s.rows_per_rank) - first};
}
}  // namespace

ShardPlan make_shard_plan(const Transformer& model, int64_t group, int64_t rank, const ParamFilter& select) {
  if (group < 1 || rank < 0 || rank >= group)
    throw std::invalid_argument("shard plan: rank " + std::to_string(rank) + " of a group of " + std::to_string(group));
  ShardPlan plan;
  plan.group = group;
  plan.rank = rank;
  const size_t n = model.units().size();
  plan.unit_of.assign(n, -1);
  for (size_t u = 0; u < n; ++u) {
    // The output head reads the embedding's weight when tied: one unit, gathered across both uses.
    const bool joins_embedding = model.args().tie_word_embeddings && u + 1 == n && n > 1;
    if (joins_embedding) {
      plan.unit_of[u] = plan.unit_of[0];
    } else {
      plan.unit_of[u] = int(plan.units.size());
      plan.units.emplace_back();
    }
    ShardUnit& su = plan.units[size_t(plan.unit_of[u])];
    su.members.push_back(u);
    for (Parameter* p : model.unit_parameters(u)) {
      if (select && !select(*p)) continue;
      ShardedParam sp;
      sp.param = p;
      sp.shard = dim0_shard(p->local_shape, group, rank);
      sp.shard_offset = su.shard_elems;
      sp.full_offset = su.full_elems;
      su.shard_elems += align16(sp.shard.padded_elems());
      su.full_elems += align16(shape_numel(p->local_shape));
      su.params.push_back(sp);
    }
  }
  return plan;
}

void copy_out_gathered(Device& dev, const ShardUnit& u, int64_t group, const Tensor& gathered, const FullView& full_of,
                       int64_t skip_rank) {
  for (const ShardedParam& sp : u.params) {
    const int64_t c = sp.shard.row_elems;
    const Tensor full = full_of(sp);
    for (int64_t k = 0; k < group; ++k) {
      const auto [first, rows] = block_rows(sp.shard, k);
      if (rows == 0 || k == skip_rank) continue;
      dev.copy(full.view({rows * c}, first * c), gathered.view({rows * c}, k * u.shard_elems + sp.shard_offset));
    }
  }
}

void copy_in_for_scatter(Device& dev, const ShardUnit& u, int64_t group, const FullView& full_of, const Tensor& scatter) {
  dev.fill(scatter, 0.0f);  // padding rows reduce to zero
  for (const ShardedParam& sp : u.params) {
    const int64_t c = sp.shard.row_elems;
    const Tensor full = full_of(sp);
    for (int64_t k = 0; k < group; ++k) {
      const auto [first, rows] = block_rows(sp.shard, k);
      if (rows == 0) continue;
      dev.copy(scatter.view({rows * c}, k * u.shard_elems + sp.shard_offset), full.view({rows * c}, first * c));
    }
  }
}

}  // namespace meshtrain
