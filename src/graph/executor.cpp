#include "graph/executor.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "util/trace.hpp"

namespace meshtrain {

bool CheckpointPolicy::recompute(int64_t block) const {
  if (block < 0) return false;  // embedding and head are cheap to keep and costly to redo
  switch (mode) {
    case Mode::kNone: return false;
    case Mode::kFull:
    case Mode::kOp: return true;
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
  if (option == "op") {
    p.mode = Mode::kOp;
    return p;
  }
  p.mode = Mode::kSelective;
  size_t used = 0;
  p.every = std::stoll(option, &used);
  if (used != option.size() || p.every < 1)
    throw std::invalid_argument("selective_ac_option '" + option + "' is not a positive integer");
  return p;
}

Executor::Executor(std::vector<Layer*> units, std::vector<int64_t> block_index, CheckpointPolicy policy, size_t first,
                   size_t last)
    : units_(std::move(units)), block_index_(std::move(block_index)), policy_(policy), first_(first),
      last_(std::min(last, units_.size())) {
  if (units_.size() != block_index_.size()) throw std::invalid_argument("executor: block index per unit");
  if (first_ >= last_) throw std::invalid_argument("executor: empty unit range");
}

Executor::MicroBatch& Executor::at(int64_t mb, const char* op) {
  const auto it = state_.find(mb);
  if (it == state_.end())
    throw std::logic_error(std::string("executor: ") + op + " of micro-batch " + std::to_string(mb) +
                           " without its forward");
  return it->second;
}

Tensor Executor::forward(int64_t mb, StepContext& ctx, const Tensor& input) {
  if (!ctx.need_backward) return forward_only(ctx, input);
  if (state_.count(mb)) throw std::logic_error("executor: micro-batch " + std::to_string(mb) + " already in flight");
  dev_ = ctx.dev;
  MicroBatch& s = state_[mb];
  const size_t n = last_ - first_;
  s.saved.resize(n);
  s.inputs.resize(n);
  Tensor x = input;
  for (size_t u = first_; u < last_; ++u) {
    const size_t i = u - first_;
    if (hooks_) hooks_->pre_forward(u, mb);
    const bool recompute = policy_.recompute(block_index_[u]);
    s.saved[i].set_mode(!recompute                     ? SavedTensors::Mode::kKeep
                        : policy_.mode == CheckpointPolicy::Mode::kOp ? SavedTensors::Mode::kOpRecord
                                                                      : SavedTensors::Mode::kDiscard);
    if (recompute) s.inputs[i] = x;
    {
      trace::Span span(units_[u]->name(), "forward");
      x = units_[u]->forward(ctx, s.saved[i], x);
    }
    if (hooks_) hooks_->post_forward(u, mb);
  }
  return x;
}

Tensor Executor::run_backward(int64_t mb, StepContext& ctx, const Tensor& dout, bool split) {
  MicroBatch& s = at(mb, split ? "backward_input" : "backward");
  if (s.input_done) throw std::logic_error("executor: backward of micro-batch " + std::to_string(mb) + " twice");
  if (split) s.weight_grads.resize(last_ - first_);
  Tensor dx = dout;
  for (size_t u = last_; u-- > first_;) {
    const size_t i = u - first_;
    if (hooks_) hooks_->pre_backward(u, mb);
    SavedTensors& saved = s.saved[i];
    if (saved.needs_recompute()) {
      const bool per_op = saved.mode() == SavedTensors::Mode::kOpRecord;
      saved.set_mode(per_op ? SavedTensors::Mode::kOpReplay : SavedTensors::Mode::kKeep);
      trace::Span span(units_[u]->name(), "recompute");
      // Recomputation records nothing: forward never touches weight gradients.
      units_[u]->forward(ctx, saved, s.inputs[i]);
      s.inputs[i] = Tensor();
      if (saved.stashed())
        throw std::logic_error("unit " + units_[u]->name() + " replayed fewer kept operators than its forward ran");
      saved.set_mode(SavedTensors::Mode::kKeep);
    }
    ctx.defer_weight_grads = split ? &s.weight_grads[i] : nullptr;
    {
      trace::Span span(units_[u]->name(), "backward");
      dx = units_[u]->backward(ctx, saved, dx);
    }
    ctx.defer_weight_grads = nullptr;
    if (!saved.empty()) throw std::logic_error("unit " + units_[u]->name() + " left saved tensors");
    if (!split && hooks_) hooks_->post_backward(u, mb);
  }
  if (split)
    s.input_done = true;
  else
    state_.erase(mb);
  return dx;
}

Tensor Executor::backward(int64_t mb, StepContext& ctx, const Tensor& dout) { return run_backward(mb, ctx, dout, false); }

Tensor Executor::backward_input(int64_t mb, StepContext& ctx, const Tensor& dout) {
  return run_backward(mb, ctx, dout, true);
}

void Executor::backward_weight(int64_t mb) {
  MicroBatch& s = at(mb, "backward_weight");
  if (!s.input_done)
    throw std::logic_error("executor: backward_weight of micro-batch " + std::to_string(mb) + " before backward_input");
  for (size_t u = last_; u-- > first_;) {
    {
      trace::Span span(units_[u]->name(), "backward_weight");
      s.weight_grads[u - first_].run(*dev_);
    }
    if (hooks_) hooks_->post_backward(u, mb);
  }
  state_.erase(mb);
}

void Executor::forward_backward(StepContext& ctx) {
  forward(0, ctx, Tensor());
  backward(0, ctx, Tensor());
}

Tensor Executor::forward_only(StepContext& ctx, const Tensor& input) {
  SavedTensors discard;
  discard.set_discard(true);
  Tensor x = input;
  for (size_t u = first_; u < last_; ++u) {
    if (hooks_) hooks_->pre_forward(u, -1);
    {
      trace::Span span(units_[u]->name(), "forward");
      x = units_[u]->forward(ctx, discard, x);
    }
    if (hooks_) hooks_->post_forward(u, -1);
  }
  return x;
}

}  // namespace meshtrain
