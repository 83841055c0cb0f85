#include "optim/adamw.hpp"

#include <cmath>

namespace meshtrain {

namespace {
constexpr int64_t kAlign = 16;  // elements: 64-byte aligned state views
}

AdamW::AdamW(const std::vector<LocalShard>& shards, Device& dev, const OptimizerSection& cfg)
    : shards_(shards), dev_(dev), cfg_(cfg) {
  int64_t total = 0;
  for (const LocalShard& s : shards) {
    offsets_.push_back(total);
    total += (s.value.numel() + kAlign - 1) / kAlign * kAlign;
  }
  m_ = dev.zeros({std::max<int64_t>(total, 1)}, DType::kF32, MemCategory::kOptimizer);
  v_ = dev.zeros({std::max<int64_t>(total, 1)}, DType::kF32, MemCategory::kOptimizer);
}

const std::string& AdamW::name() const {
  static const std::string n = "AdamW";
  return n;
}

std::vector<std::string> AdamW::state_names(const Parameter&) const { return {"exp_avg", "exp_avg_sq"}; }

std::vector<Tensor> AdamW::state_of(size_t shard) const {
  const int64_t n = shards_.at(shard).value.numel();
  return {m_.view({n}, offsets_.at(shard)), v_.view({n}, offsets_.at(shard))};
}

void AdamW::step(float lr) {
  ++t_;
  AdamWParams p;
  p.lr = lr;
  p.beta1 = float(cfg_.beta1);
  p.beta2 = float(cfg_.beta2);
  p.eps = float(cfg_.eps);
  p.step = t_;
  std::vector<AdamWSegment> segments;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const LocalShard& s = shards_[i];
    const int64_t n = s.value.numel();
    if (n == 0) continue;  // a tensor with fewer rows than the shard group
    const float wd = (s.param->weight_decay || cfg_.decay_embeddings_and_norms) ? float(cfg_.weight_decay) : 0.0f;
    segments.push_back({s.value, s.grad, m_.view({n}, offsets_[i]), v_.view({n}, offsets_[i]), wd});
  }
  dev_.adamw_multi(segments, p);  // one launch per batch of tensors on CUDA (multi-tensor apply)
}

double grad_norm(Device& dev, GradientSync& sync, Communicator* tp, std::vector<double>* each, Communicator* pp) {
  double s = sync.grad_sum_squares(dev, each);
  if (tp && tp->size() > 1) tp->all_reduce_host(&s, 1, ReduceOp::kSum);
  if (pp && pp->size() > 1) pp->all_reduce_host(&s, 1, ReduceOp::kSum);
  return std::sqrt(s);
}

double clip_grad_norm(Device& dev, const std::vector<LocalShard>& shards, double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double s = max_norm / (norm + 1e-6);
  if (s >= 1.0) return 1.0;
  for (const LocalShard& ls : shards)
    if (ls.grad.numel() > 0) dev.scale(ls.grad, float(s));
  return s;
}

}  // namespace meshtrain
