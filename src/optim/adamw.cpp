#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

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

bool AdamW::write_compute_copies(const std::vector<Tensor>& copies) {
  if (copies.size() != shards_.size())
    throw std::invalid_argument("AdamW::write_compute_copies: " + std::to_string(copies.size()) + " copies for " +
                                std::to_string(shards_.size()) + " shards");
  for (size_t i = 0; i < copies.size(); ++i)
    if (copies[i].defined() &&
        (copies[i].dtype() != DType::kBF16 || copies[i].numel() != shards_[i].value.numel()))
      throw std::invalid_argument("AdamW::write_compute_copies: the copy of shard " + std::to_string(i) + " (" +
                                  shards_[i].param->name + ") must be bfloat16 of " +
                                  std::to_string(shards_[i].value.numel()) + " elements");
  compute_ = copies;
  return true;
}

void AdamW::step(float lr, float grad_scale) {
  ++t_;
  AdamWParams p;
  p.lr = lr;
  p.grad_scale = grad_scale;
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
    segments.push_back({s.value, s.grad, m_.view({n}, offsets_[i]), v_.view({n}, offsets_[i]), wd,
                        compute_.empty() ? Tensor() : compute_[i]});
  }
  dev_.adamw_multi(segments, p);  // one launch per batch of tensors on CUDA (multi-tensor apply)
}

double grad_norm(Device& dev, GradientSync& sync, Communicator* tp, std::vector<double>* each, Communicator* pp) {
  double s = sync.grad_sum_squares(dev, each);
  if (tp && tp->size() > 1) tp->all_reduce_host(&s, 1, ReduceOp::kSum);
  if (pp && pp->size() > 1) pp->all_reduce_host(&s, 1, ReduceOp::kSum);
  return std::sqrt(s);
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace meshtrain
