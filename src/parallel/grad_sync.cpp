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
  std::vector<Tensor> grads;
  std::vector<double> divisors;
  for (const LocalShard& ls : shards) {
    if (ls.grad.numel() == 0) continue;
    const ShardingSpec& sh = ls.param->sharding;
    // Every tp rank holds the same replicated gradient: each counts 1/tp of it, so the sum
    // over the tp group counts it once.
    grads.push_back(ls.grad);
    divisors.push_back(double(sh.tp_dim < 0 ? sh.tp_size : 1));
  }
  return dev.sum_squares_multi(grads, divisors);  // one host synchronization on CUDA
}

}  // namespace meshtrain
