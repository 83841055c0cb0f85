#include "optim/adamw.hpp"

#include <cmath>

namespace meshtrain {

AdamW::AdamW(Transformer& model, Device& dev, const OptimizerSection& cfg) : model_(model), dev_(dev), cfg_(cfg) {
  m_ = dev.zeros(model.flat_params().shape(), DType::kF32, MemCategory::kOptimizer);
  v_ = dev.zeros(model.flat_params().shape(), DType::kF32, MemCategory::kOptimizer);
}

void AdamW::step(float lr) {
  ++t_;
  AdamWParams p;
  p.lr = lr;
  p.beta1 = float(cfg_.beta1);
  p.beta2 = float(cfg_.beta2);
  p.eps = float(cfg_.eps);
  p.step = t_;
  for (Parameter* param : model_.parameters()) {
    p.weight_decay = (param->weight_decay || cfg_.decay_embeddings_and_norms) ? float(cfg_.weight_decay) : 0.0f;
    const int64_t n = param->value.numel();
    dev_.adamw(param->value.view({n}), param->grad.view({n}), m_.view({n}, param->flat_offset),
               v_.view({n}, param->flat_offset), p);
  }
}

double grad_norm(Device& dev, const Transformer& model) { return std::sqrt(dev.sum_squares(model.flat_grads())); }

double clip_grad_norm(Device& dev, const Transformer& model, double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double s = max_norm / (norm + 1e-6);
  if (s >= 1.0) return 1.0;
  dev.scale(model.flat_grads(), float(s));
  return s;
}

}  // namespace meshtrain
