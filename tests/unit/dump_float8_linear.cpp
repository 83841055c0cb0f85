// Runs one Float8 linear layer (model/layers/primitives.hpp with Parameter::float8 set) on the
// CPU device for validation/check_float8_linear.py, which recomputes its three GEMMs with an
// independent NumPy emulation and compares them bit for bit.
// usage: dump_float8_linear RECIPE M K N DIR
//   DIR holds x.f32 [M, K], w.f32 [N, K] and dy.f32 [M, N] (little-endian float32, row-major);
//   writes DIR/RECIPE_y.f32 [M, N] = x · Wᵀ, RECIPE_dx.f32 [M, K] = dy · W and RECIPE_dw.f32
//   [N, K] = dyᵀ · x (the weight gradient accumulated into zeros), each through the recipe's
//   operand casts; then the same weight gradient once more through the split backward's
//   WeightGradQueue (RECIPE_dw_deferred.f32).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cpu/cpu_device.hpp"
#include "model/layers/primitives.hpp"
#include "model/weight_grad_queue.hpp"
#include "tensor/float8.hpp"

using namespace meshtrain;

namespace {

Tensor read(Device& dev, const std::string& path, const Shape& s) {
  Tensor t = dev.empty(s, DType::kF32, MemCategory::kTemporaries);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(t.f32(), sizeof(float), size_t(t.numel()), f) != size_t(t.numel()))
    throw std::runtime_error("cannot read " + std::to_string(t.numel()) + " floats from " + path);
  std::fclose(f);
  return t;
}

void write(const std::string& path, const Tensor& t) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(t.f32(), sizeof(float), size_t(t.numel()), f) != size_t(t.numel()))
    throw std::runtime_error("cannot write " + path);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: dump_float8_linear RECIPE M K N DIR\n");
    return 2;
  }
  const std::string recipe = argv[1], dir = argv[5];
  const int64_t m = std::atoll(argv[2]), k = std::atoll(argv[3]), n = std::atoll(argv[4]);
  CpuDevice dev(1);
  const Tensor x = read(dev, dir + "/x.f32", {m, k}), dy = read(dev, dir + "/dy.f32", {m, n});
  Parameter w = make_parameter("layers.0.attention.wq.weight", {n, k}, InitSpec{});
  w.value = read(dev, dir + "/w.f32", {n, k});
  w.grad = dev.empty({n, k}, DType::kF32, MemCategory::kTemporaries);
  dev.fill(w.grad, 0.0f);
  w.float8 = std::make_shared<const Float8LinearRecipe>(float8_linear_recipe(recipe));
  StepContext ctx;
  ctx.dev = &dev;
  const std::string out = dir + "/" + recipe + "_";
  write(out + "y.f32", linear_forward(dev, x, w));
  write(out + "dx.f32", linear_backward(ctx, dy, x, w));
  write(out + "dw.f32", w.grad);
  WeightGradQueue queue;
  ctx.defer_weight_grads = &queue;
  dev.fill(w.grad, 0.0f);
  linear_backward(ctx, dy, x, w);
  queue.run(dev);
  write(out + "dw_deferred.f32", w.grad);
  return 0;
}
