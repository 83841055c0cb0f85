#include "model/parameter.hpp"

#include <stdexcept>

namespace meshtrain {

void split_tensor_parallel(Parameter& p, int dim, int64_t tp, int64_t rank) {
  if (tp == 1) return;
  if (dim < 0 || dim >= int(p.shape.size()))
    throw std::invalid_argument(p.name + ": tensor-parallel dim " + std::to_string(dim) + " out of range");
  const auto [first, count] = chunk_range(p.shape[size_t(dim)], tp, rank);
  if (count == 0)
    throw std::invalid_argument(p.name + ": tp rank " + std::to_string(rank) + " of " + std::to_string(tp) +
                                " would hold none of its " + std::to_string(p.shape[size_t(dim)]) + " rows");
  p.sharding.tp_dim = dim;
  p.sharding.tp_size = tp;
  p.sharding.tp_first = first;
  p.local_shape = p.shape;
  p.local_shape[size_t(dim)] = count;
}

void split_expert_parallel(Parameter& p, int64_t ep, int64_t rank) {
  if (ep == 1) return;
  if (p.shape.empty() || p.shape[0] % ep || rank < 0 || rank >= ep)
    throw std::invalid_argument(p.name + ": " + std::to_string(p.shape.empty() ? 0 : p.shape[0]) +
                                " experts do not split over ep " + std::to_string(ep) + " (rank " +
                                std::to_string(rank) + ")");
  const int64_t local = p.shape[0] / ep;
  p.sharding.ep_size = ep;
  p.sharding.ep_first = rank * local;
  p.local_shape[0] = local;
}

int64_t global_flat_index(const Parameter& p, int64_t i) {
  if (p.sharding.expert_parallel()) {  // experts first, whole: an offset of ep_first experts
    int64_t per_expert = 1;
    for (size_t k = 1; k < p.shape.size(); ++k) per_expert *= p.shape[k];
    return p.sharding.ep_first * per_expert + i;
  }
  const int d = p.sharding.tp_dim;
  if (d < 0) return i;
  int64_t inner = 1;
  for (size_t k = size_t(d) + 1; k < p.shape.size(); ++k) inner *= p.shape[k];
  const int64_t local_extent = p.local_shape[size_t(d)], extent = p.shape[size_t(d)];
  const int64_t outer = i / (local_extent * inner), j = (i / inner) % local_extent, r = i % inner;
  return (outer * extent + p.sharding.tp_first + j) * inner + r;
}

}  // namespace meshtrain
