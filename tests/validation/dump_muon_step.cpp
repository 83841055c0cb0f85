// Dumps two Muon steps (and the AdamW steps of its other parameters) on a small Mixture-of-Experts
// model with fixed pseudo-random gradients, for the independent PyTorch check
// validation/check_muon.py. The gradients are synthetic on purpose: this checks the optimizer
// alone (the model's gradients are checked by check_gradients.py).
//
// usage: dump_muon_step OUT_DIR
// Writes OUT_DIR/muon.json (hyper-parameters, the two learning rates, and per parameter its name,
// shape and group "muon" or "adamw" with its weight decay) and raw little-endian f32 arrays
// <name>.{p0,g1,p1,g2,p2,state} (state: momentum_buffer, or exp_avg after step 2). Exits 2 on
// bad arguments.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optim/muon.hpp"
#include "tiny_model.hpp"

using namespace meshtrain;

namespace {

float noise(uint64_t stream, uint64_t i) {  // splitmix64 in [-1, 1)
  uint64_t z = (stream << 40) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(double(z >> 11) / double(1ull << 53) * 2.0 - 1.0);
}

void write(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(t.raw()), std::streamsize(t.nbytes()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dump_muon_step OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  ModelArgs a = testing::tiny_model_args(48, 2, 4, 2, 97);
  a.num_experts = 4;
  a.top_k = 2;
  a.moe_inter_dim = 40;
  a.n_dense_layers = 1;
  auto dev = make_device("cpu", 1);
  Transformer model(a, *dev);
  model.init_weights(5);
  OptimizerSection cfg;
  cfg.name = "Muon";
  cfg.weight_decay = 0.1;
  cfg.adamw_lr = 0.004;  // the AdamW group's own base rate, scaled by the schedule like lr
  cfg.lr = 0.02;
  const std::vector<float> lrs = {0.02f, 0.015f};  // the scheduled lr of steps 1 and 2
  const auto shards = replicated_shards(model);
  Muon opt(shards, *dev, cfg, MuonComms{});
  nlohmann::json meta;
  meta["lr"] = lrs;
  meta["base_lr"] = cfg.lr;
  meta["adamw_lr"] = *cfg.adamw_lr;
  meta["weight_decay"] = cfg.weight_decay;
  meta["momentum"] = cfg.muon_momentum;
  meta["nesterov"] = cfg.muon_use_nesterov;
  meta["ns_steps"] = cfg.muon_num_ns_steps;
  meta["extra_scale"] = cfg.muon_extra_scale_factor;
  meta["beta1"] = cfg.beta1;
  meta["beta2"] = cfg.beta2;
  meta["eps"] = cfg.eps;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Parameter& p = *shards[i].param;
    const bool muon = opt.state_names(p).front() == "momentum_buffer";
    meta["params"].push_back({{"name", p.name},
                              {"shape", p.shape},
                              {"group", muon ? "muon" : "adamw"},
                              {"weight_decay", p.weight_decay}});
    write(out + "/" + p.name + ".p0", p.value);
  }
  for (int step = 1; step <= 2; ++step) {
    for (size_t i = 0; i < shards.size(); ++i) {
      const Tensor& g = shards[i].grad;
      for (int64_t k = 0; k < g.numel(); ++k) g.f32()[k] = 0.1f * noise(uint64_t(step * 1000 + int(i)), uint64_t(k));
      write(out + "/" + shards[i].param->name + ".g" + std::to_string(step), g);
    }
    opt.step(lrs[size_t(step - 1)], 1.0f);
    for (const LocalShard& s : shards) write(out + "/" + s.param->name + ".p" + std::to_string(step), s.value);
  }
  for (size_t i = 0; i < shards.size(); ++i) write(out + "/" + shards[i].param->name + ".state", opt.state_of(i).front());
  std::ofstream(out + "/muon.json") << meta.dump(1);
  std::printf("dumped %zu parameters after 2 Muon steps to %s\n", shards.size(), out.c_str());
  return 0;
}
