#include "train/moe_balance.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace meshtrain {

MoeStepMetrics::Summary MoeStepMetrics::summary(size_t layer) const {
  const std::vector<double>& v = tokens_per_expert.at(layer);
  Summary s;
  if (v.empty()) return s;
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  double mean = 0, var = 0;
  for (double x : v) mean += x;
  mean /= double(v.size());
  for (double x : v) var += (x - mean) * (x - mean);
  var /= double(v.size());
  s.cv = mean > 0 ? std::sqrt(var) / mean : 0.0;
  return s;
}

std::pair<int64_t, double> MoeStepMetrics::worst_imbalance() const {
  std::pair<int64_t, double> worst{-1, 0.0};
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::vector<double>& v = tokens_per_expert[i];
    double mean = 0;
    for (double x : v) mean += x;
    mean /= double(v.size());
    const double ratio = mean > 0 ? *std::max_element(v.begin(), v.end()) / mean : 0.0;
    if (worst.first < 0 || ratio > worst.second) worst = {layers[i], ratio};
  }
  return worst;
}

MoeStepMetrics finish_moe_step(const ModelArgs& args, const std::vector<MoE*>& held, Communicator& world,
                               bool update_bias) {
  MoeStepMetrics m;
  for (int64_t i = 0; i < args.n_layers; ++i)
    if (args.is_moe_layer(i)) m.layers.push_back(i);
  const size_t n = m.layers.size(), e = size_t(args.num_experts);
  if (n == 0) return m;
  auto slot = [&](int64_t block) {
    return size_t(std::lower_bound(m.layers.begin(), m.layers.end(), block) - m.layers.begin());
  };
  // Sums: [n·E] loads, then the balance and z losses. A layer's replicas over dp / cp / tp each
  // add their own tokens; pp stages add only the layers they hold.
  std::vector<double> sums(n * e + 3, 0.0);
  for (size_t h = 0; h < held.size(); ++h) {
    const MoeStepStats& st = held[h]->step_stats();
    const size_t j = slot(held[h]->layer_id());
    for (size_t x = 0; x < e; ++x) sums[j * e + x] += st.tokens_per_expert[x];
    sums[n * e] += st.aux_loss;
    sums[n * e + 1] += st.z_loss;
    sums[n * e + 2] += st.dispatch_s;
  }
  world.all_reduce_host(sums.data(), int(sums.size()), ReduceOp::kSum);
  m.tokens_per_expert.assign(n, std::vector<double>(e));
  for (size_t j = 0; j < n; ++j)
    std::copy(sums.begin() + std::ptrdiff_t(j * e), sums.begin() + std::ptrdiff_t((j + 1) * e),
              m.tokens_per_expert[j].begin());
  m.aux_loss = sums[n * e];
  m.z_loss = sums[n * e + 1];
  m.dispatch_s = sums[n * e + 2] / double(world.size());

  // Bias ranges after the update, by max-reduction ([max, −min] per layer) from the holders.
  std::vector<double> range(2 * n, -std::numeric_limits<double>::infinity());
  for (size_t h = 0; h < held.size(); ++h) {
    MoE& layer = *held[h];
    const size_t j = slot(held[h]->layer_id());
    if (update_bias && args.load_balance_coeff > 0)
      layer.set_expert_bias(update_expert_bias(layer.expert_bias(), m.tokens_per_expert[j], args.load_balance_coeff));
    layer.clear_step_stats();
    const auto [lo, hi] = std::minmax_element(layer.expert_bias().begin(), layer.expert_bias().end());
    range[2 * j] = *hi;
    range[2 * j + 1] = -double(*lo);
  }
  world.all_reduce_host(range.data(), int(range.size()), ReduceOp::kMax);
  for (size_t j = 0; j < n; ++j) {
    m.bias_max.push_back(float(range[2 * j]));
    m.bias_min.push_back(float(-range[2 * j + 1]));
  }
  return m;
}

namespace {
// The position of block `block` among the model's MoE blocks.
size_t moe_slot(const ModelArgs& args, int64_t block) {
  size_t j = 0;
  for (int64_t i = 0; i < block; ++i) j += args.is_moe_layer(i);
  return j;
}
}  // namespace

std::vector<std::vector<float>> gather_expert_biases(const ModelArgs& args, const std::vector<MoE*>& held,
                                                     Communicator& world) {
  const size_t n = size_t(args.num_moe_layers()), e = size_t(args.num_experts);
  if (n == 0) return {};
  std::vector<double> all(n * e, -std::numeric_limits<double>::infinity());
  for (const MoE* m : held) {
    const size_t j = moe_slot(args, m->layer_id());
    for (size_t x = 0; x < e; ++x) all[j * e + x] = m->expert_bias()[x];
  }
  world.all_reduce_host(all.data(), int(all.size()), ReduceOp::kMax);
  std::vector<std::vector<float>> out(n, std::vector<float>(e));
  for (size_t j = 0; j < n; ++j)
    for (size_t x = 0; x < e; ++x) out[j][x] = float(all[j * e + x]);
  return out;
}

void restore_expert_biases(const ModelArgs& args, const std::vector<MoE*>& held,
                           const std::vector<std::vector<float>>& biases) {
  if (int64_t(biases.size()) != args.num_moe_layers())
    throw std::invalid_argument("expert biases for " + std::to_string(biases.size()) + " MoE blocks, the model has " +
                                std::to_string(args.num_moe_layers()));
  for (MoE* m : held) m->set_expert_bias(biases[moe_slot(args, m->layer_id())]);
}

}  // namespace meshtrain
