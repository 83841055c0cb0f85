#include "plan/muon_model.hpp"

#include <algorithm>

namespace meshtrain {

std::vector<MuonMatrix> muon_matrices(const ModelArgs& a, int64_t block) {
  const int64_t q = a.n_heads * a.head_dim, kv = a.n_kv_heads * a.head_dim;
  std::vector<MuonMatrix> out = {{q, a.dim}, {kv, a.dim}, {kv, a.dim}, {a.dim, q}};
  auto ffn = [&](int64_t width, int64_t count) {
    out.push_back({width, a.dim, count});  // w1
    out.push_back({width, a.dim, count});  // w3
    out.push_back({a.dim, width, count});  // w2
  };
  if (!a.is_moe_layer(block)) {
    ffn(a.ffn_dim(), 1);
    return out;
  }
  out.push_back({a.num_experts, a.dim});  // the router
  ffn(a.moe_inter_dim, a.num_experts);
  if (a.num_shared_experts > 0) ffn(a.num_shared_experts * a.moe_inter_dim, 1);
  return out;
}

double newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps) {
  const double m = double(std::min(rows, cols)), n = double(std::max(rows, cols));
  return double(steps) * (4.0 * m * m * n + 2.0 * m * m * m);
}

int64_t newton_schulz_workspace(int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols);
  return 3 * rows * cols + 3 * m * m;
}

bool uses_muon(const JobConfig& cfg) { return cfg.optimizer.name == "Muon"; }

}  // namespace meshtrain
