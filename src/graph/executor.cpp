#include "graph/executor.hpp"

#include <stdexcept>

#include "util/trace.hpp"

namespace meshtrain {

bool CheckpointPolicy::recompute(int64_t block) const {
  if (block < 0) return false;  // embedding and head are cheap to keep and costly to redo
  switch (mode) {
    case Mode::kNone: return false;
    case Mode::kFull: return true;
    case Mode::kSelective: return block % every == 0;
  }
  return false;
}

CheckpointPolicy CheckpointPolicy::from_deck(const std::string& mode, const std::string& option) {
  CheckpointPolicy p;
  if (mode == "none") return p;
  if (mode == "full") {
    p.mode = Mode::kFull;
    return p;
  }
  if (mode != "selective") throw std::invalid_argument("activation checkpoint mode '" + mode + "'");
  p.mode = Mode::kSelective;
  size_t used = 0;
  p.every = std::stoll(option, &used);
  if (used != option.size() || p.every < 1)
    throw std::invalid_argument("selective_ac_option '" + option + "' is not a positive integer");
  return p;
}

Executor::Executor(std::vector<Layer*> units, std::vector<int64_t> block_index, CheckpointPolicy policy)
    : units_(std::move(units)), block_index_(std::move(block_index)), policy_(policy) {
  if (units_.size() != block_index_.size()) throw std::invalid_argument("executor: block index per unit");
  saved_.resize(units_.size());
  inputs_.resize(units_.size());
}

void Executor::forward_backward(StepContext& ctx) {
  const size_t n = units_.size();
  Tensor x;
  for (size_t u = 0; u < n; ++u) {
    if (hooks_) hooks_->pre_forward(u);
    const bool recompute = policy_.recompute(block_index_[u]);
    saved_[u].clear();
    saved_[u].set_discard(recompute);
    inputs_[u] = recompute ? x : Tensor();
    {
      trace::Span span(units_[u]->name(), "forward");
      x = units_[u]->forward(ctx, saved_[u], x);
    }
    if (hooks_) hooks_->post_forward(u);
  }
  Tensor dx;
  for (size_t u = n; u-- > 0;) {
    if (hooks_) hooks_->pre_backward(u);
    if (saved_[u].discard()) {
      saved_[u].set_discard(false);
      trace::Span span(units_[u]->name(), "recompute");
      units_[u]->forward(ctx, saved_[u], inputs_[u]);  // recompute, saving this time
      inputs_[u] = Tensor();
    }
    {
      trace::Span span(units_[u]->name(), "backward");
      dx = units_[u]->backward(ctx, saved_[u], dx);
    }
    if (!saved_[u].empty()) throw std::logic_error("unit " + units_[u]->name() + " left saved tensors");
    if (hooks_) hooks_->post_backward(u);
  }
}

void Executor::forward(StepContext& ctx) {
  SavedTensors discard;
  discard.set_discard(true);
  Tensor x;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (hooks_) hooks_->pre_forward(u);
    {
      trace::Span span(units_[u]->name(), "forward");
      x = units_[u]->forward(ctx, discard, x);
    }
    if (hooks_) hooks_->post_forward(u);
  }
}

}  // namespace meshtrain
