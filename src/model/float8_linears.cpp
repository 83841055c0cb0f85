#include "model/float8_linears.hpp"

#include <memory>
#include <utility>

#include "tensor/float8.hpp"

namespace meshtrain {

namespace {

// The module names of the linear layers linear_forward / linear_backward run (their weights
// are "<module>.weight"), by their last components.
bool is_block_linear(const std::string& module) {
  for (const char* tail : {".attention.wq", ".attention.wk", ".attention.wv", ".attention.wo", ".feed_forward.w1",
                           ".feed_forward.w2", ".feed_forward.w3", ".router.gate", ".shared_experts.w1",
                           ".shared_experts.w2", ".shared_experts.w3"}) {
    const std::string t = tail;
    if (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> convert_float8_linears(Transformer& model, const Float8Config& f8) {
  Float8LinearRecipe r = float8_linear_recipe(f8.recipe);
  r.emulate = f8.emulate;
  const auto recipe = std::make_shared<const Float8LinearRecipe>(std::move(r));
  std::vector<std::string> converted;
  const std::string suffix = ".weight";
  for (Parameter* p : model.parameters()) {
    if (p->shape.size() != 2 || p->name.size() <= suffix.size()) continue;
    const std::string module = p->name.substr(0, p->name.size() - suffix.size());
    if (p->name.compare(module.size(), suffix.size(), suffix) != 0 || !is_block_linear(module)) continue;
    if (!float8_converts(f8, module, p->shape[0], p->shape[1])) continue;
    p->float8 = recipe;
    const TensorParallel& tp = model.tensor_parallel();
    p->float8_tp = tp.active() && p->sharding.tp_dim >= 0 ? tp.comm : nullptr;
    converted.push_back(module);
  }
  return converted;
}

}  // namespace meshtrain
