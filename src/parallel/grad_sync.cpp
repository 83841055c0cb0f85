#include "parallel/grad_sync.hpp"

#include <stdexcept>

namespace meshtrain {

std::vector<LocalShard> replicated_shards(const Transformer& model) {
  if (!model.flat_params().defined() || !model.flat_grads().defined())
    throw std::logic_error("replicated_shards: the model does not hold replicated parameters and gradients");
  std::vector<LocalShard> out;
  for (Parameter* p : model.parameters())
    out.push_back({p, p->value.reshape({p->value.numel()}), p->grad.reshape({p->grad.numel()})});
  return out;
}

double local_sum_squares(Device& dev, const std::vector<LocalShard>& shards) {
  double s = 0;
  for (const LocalShard& ls : shards)
    if (ls.grad.numel() > 0) s += dev.sum_squares(ls.grad);
  return s;
}

}  // namespace meshtrain
