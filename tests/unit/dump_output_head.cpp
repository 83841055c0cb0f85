// Dumps one forward + backward of the output head (RMSNorm, output projection, cross-entropy with
// PaLM's z-loss, optionally chunked) on deterministic pseudo-random inputs, for the independent
// float64 check validation/check_z_loss.py.
//
// usage: dump_output_head OUT_DIR [--chunk C] [--zeta Z] [--tokens N]
// Writes OUT_DIR/head.json (shapes, eps, ζ, grad_scale, loss_sum, z_loss_sum) and raw
// little-endian arrays x.f32 [N, D], norm.f32 [D], w.f32 [V, D], targets.i32 [N], dx.f32 [N, D],
// dnorm.f32 [D], dw.f32 [V, D]. Exits 2 on bad arguments.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/layers/embedding.hpp"

using namespace meshtrain;

namespace {

// A fixed pseudo-random value in [-1, 1) per (stream, index): splitmix64.
float noise(uint64_t stream, uint64_t i) {
  uint64_t z = (stream << 40) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(double(z >> 11) / double(1ull << 53) * 2.0 - 1.0);
}

Tensor filled(Device& dev, const Shape& s, uint64_t stream, float scale, float offset, MemCategory cat) {
  Tensor t = dev.empty(s, DType::kF32, cat);
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + scale * noise(stream, i);
  dev.upload(t, v.data(), v.size() * sizeof(float));
  return t;
}

void write(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(t.raw()), std::streamsize(t.numel() * 4));
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dump_output_head OUT_DIR [--chunk C] [--zeta Z] [--tokens N]\n");
    return 2;
  }
  const std::string out = argv[1];
  int64_t chunk = 0, n = 600;
  double zeta = 0.05;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--chunk") chunk = std::stoll(v);
    else if (k == "--zeta") zeta = std::stod(v);
    else if (k == "--tokens") n = std::stoll(v);
    else {
      std::fprintf(stderr, "dump_output_head: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  ModelArgs a;
  a.dim = 48;
  a.vocab_size = 1000;
  a.output_z_loss_coeff = zeta;
  a.loss_chunk_tokens = chunk;
  auto dev = make_device("cpu", 1);
  OutputHead head(a, nullptr, TensorParallel{});
  // Logits of a few units so lse ≈ 7–9 and the z-loss term (2ζ·lse) is a visible part of the gradient.
  head.norm.value = filled(*dev, {a.dim}, 1, 0.2f, 1.0f, MemCategory::kParameters);
  head.output.value = filled(*dev, {a.vocab_size, a.dim}, 2, 0.5f, 0.0f, MemCategory::kParameters);
  head.norm.grad = dev->zeros({a.dim}, DType::kF32, MemCategory::kGradients);
  head.output.grad = dev->zeros({a.vocab_size, a.dim}, DType::kF32, MemCategory::kGradients);
  Tensor x = filled(*dev, {n, a.dim}, 3, 1.0f, 0.0f, MemCategory::kActivations);
  std::vector<int32_t> tg(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tg[size_t(i)] = int32_t((uint64_t(i) * 2654435761u >> 5) % uint64_t(a.vocab_size));
  StepContext ctx;
  ctx.dev = dev.get();
  ctx.targets = dev->empty({n}, DType::kI32, MemCategory::kActivations);
  dev->upload(ctx.targets, tg.data(), tg.size() * sizeof(int32_t));
  ctx.loss_grad_scale = 1.0f / float(n);
  ctx.need_backward = true;
  SavedTensors saved;
  head.forward(ctx, saved, x);
  const Tensor dx = head.backward(ctx, saved, Tensor());
  write(out + "/x.f32", x);
  write(out + "/norm.f32", head.norm.value);
  write(out + "/w.f32", head.output.value);
  write(out + "/targets.i32", ctx.targets);
  write(out + "/dx.f32", dx);
  write(out + "/dnorm.f32", head.norm.grad);
  write(out + "/dw.f32", head.output.grad);
  const nlohmann::json j = {{"tokens", n},           {"dim", a.dim},
                            {"vocab", a.vocab_size}, {"eps", a.norm_eps},
                            {"zeta", zeta},          {"chunk", chunk},
                            {"grad_scale", double(ctx.loss_grad_scale)},
                            {"loss_sum", ctx.loss_sum}, {"z_loss_sum", head.z_loss_sum()}};
  std::ofstream(out + "/head.json") << j.dump(2) << "\n";
  return 0;
}
