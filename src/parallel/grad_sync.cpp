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

double local_sum_squares(Device& dev, const std::vector<LocalShard>& shards, std::vector<double>* each) {
  std::vector<Tensor> grads;
  std::vector<double> divisors;
  std::vector<size_t> shard_of;  // grads[j] is the gradient of shards[shard_of[j]]
  for (size_t i = 0; i < shards.size(); ++i) {
    const LocalShard& ls = shards[i];
    // A tied copy's gradient equals its original's (summed between the stages): counted once.
    if (ls.grad.numel() == 0 || ls.param->sharding.tied_copy) continue;
    shard_of.push_back(i);
    const ShardingSpec& sh = ls.param->sharding;
    // Every tp rank holds the same replicated gradient: each counts 1/tp of it, so the sum
    // over the tp group counts it once.
    grads.push_back(ls.grad);
    divisors.push_back(double(sh.tp_dim < 0 ? sh.tp_size : 1));
  }
  std::vector<double> terms;
  const double s = dev.sum_squares_multi(grads, divisors, each ? &terms : nullptr);  // one host sync on CUDA
  if (each) {
    each->assign(shards.size(), 0.0);
    for (size_t j = 0; j < terms.size(); ++j) (*each)[shard_of[j]] = terms[j];
  }
  return s;
}

}  // namespace meshtrain
