// Muon on the GPU against the CPU backend: the Newton–Schulz orthogonalization of wide, tall and
// square f32 matrices (cuBLASLt f32 GEMMs against OpenBLAS sgemm, 1e-4 normwise: five iterations
// chain fifteen GEMMs), and two whole Muon steps on the MoE debug model with the same synthetic
// gradients (experts one at a time, the AdamW group at its own lr): every parameter after the
// steps within 1e-4 of the CPU's relative to the update size, and the momentum buffers to 1e-5.
// SKIPPED without a GPU.
#include <cmath>

#include "gpu_test_util.hpp"
#include "config/model_args.hpp"
#include "model/transformer.hpp"
#include "optim/muon.hpp"
#include "optim/newton_schulz.hpp"
#include "parallel/grad_sync.hpp"

using namespace meshtrain;
using namespace meshtrain::gputest;

BOOST_AUTO_TEST_CASE(newton_schulz_matches_cpu) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{96, 320}, {320, 96}, {128, 128}}) {
    Pair p = random_pair({m, n}, DType::kF32, uint64_t(m * 7 + n));
    newton_schulz_orthogonalize(cpu(), p.c, 5);
    newton_schulz_orthogonalize(gpu(), p.g, 5);
    expect_close(p, DType::kF32, "Newton-Schulz [" + std::to_string(m) + ", " + std::to_string(n) + "]", 1e-4);
  }
}

namespace {

struct After {
  std::vector<std::vector<float>> values, states;
};

/// Two Muon steps on `dev` from the same initial weights and gradients.
After two_steps(Device& dev, const ModelArgs& a) {
  Transformer model(a, dev);
  model.init_weights(5);
  OptimizerSection cfg;
  cfg.name = "Muon";
  cfg.adamw_lr = 0.004;
  cfg.lr = 0.02;
  const auto shards = replicated_shards(model);
  Muon opt(shards, dev, cfg, MuonComms{});
  for (int step = 1; step <= 2; ++step) {
    for (size_t i = 0; i < shards.size(); ++i)
      set_values(dev, shards[i].grad, randn(shards[i].grad.numel(), uint64_t(step * 1000 + int(i)), 0.1f));
    opt.step(step == 1 ? 0.02f : 0.015f, 1.0f);
  }
  After r;
  for (size_t i = 0; i < shards.size(); ++i) {
    r.values.push_back(host_values(dev, shards[i].value));
    r.states.push_back(host_values(dev, opt.state_of(i).front()));
  }
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_muon_steps_match_cpu) {
  ModelArgs a = model_flavor("llama3", "debugmodel");
  a.vocab_size = 512;
  a.num_experts = 4;
  a.top_k = 2;
  a.moe_inter_dim = 64;
  a.n_dense_layers = 1;
  Transformer shapes(a, cpu());
  shapes.init_weights(5);
  const auto init = replicated_shards(shapes);
  const After c = two_steps(cpu(), a), g = two_steps(gpu(), a);
  for (size_t i = 0; i < c.values.size(); ++i) {
    const std::vector<float> w0 = host_values(cpu(), init[i].value);
    double num = 0, den = 0;
    for (size_t k = 0; k < w0.size(); ++k) {
      num = std::max(num, double(std::fabs(g.values[i][k] - c.values[i][k])));
      den = std::max(den, double(std::fabs(c.values[i][k] - w0[k])));
    }
    const std::string& name = init[i].param->name;
    BOOST_CHECK_MESSAGE(num <= 1e-4 * den + 1e-7, name << ": update error " << num << " of " << den);
    const double se = rel_error(g.states[i], c.states[i]);
    BOOST_CHECK_MESSAGE(se <= 1e-5, name << ": state rel err " << se);
  }
}

int main(int argc, char** argv) { return gpu_test_main(argc, argv); }
