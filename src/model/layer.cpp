#include "model/layer.hpp"

#include <stdexcept>

namespace meshtrain {

Tensor SavedTensors::pop() {
  if (stack_.empty()) throw std::logic_error("backward popped more saved tensors than forward pushed");
  Tensor t = stack_.back();
  stack_.pop_back();
  return t;
}

std::vector<Tensor> SavedTensors::op_multi(SacOp kind, Device& dev, const std::function<std::vector<Tensor>()>& run,
                                     bool mutated_later) {
  if (mode_ != Mode::kOpRecord && mode_ != Mode::kOpReplay) return run();
  // TorchTitan's mm counter: the 1st, 3rd, … matmul of a unit's forward is kept, the 2nd, 4th, …
  // recomputed; the count restarts with each forward and each replay, so both agree.
  const bool keep = kind != SacOp::kMatmul || ++matmuls_ % 2 == 1;
  if (!keep) return run();
  if (mode_ == Mode::kOpReplay) {
    if (stash_.empty()) throw std::logic_error("per-op checkpointing: the replay kept more operators than the forward");
    std::vector<Tensor> out = std::move(stash_.front());
    stash_.pop_front();
    return out;
  }
  std::vector<Tensor> out = run();
  std::vector<Tensor> kept;
  kept.reserve(out.size());
  for (const Tensor& t : out) {
    if (!mutated_later || !t.defined()) {
      kept.push_back(t);
      continue;
    }
    Tensor c = dev.empty(t.shape(), t.dtype(), MemCategory::kActivations);
    dev.copy(c, t);
    kept.push_back(c);
  }
  stash_.push_back(std::move(kept));
  return out;
}

Tensor SavedTensors::op(SacOp kind, Device& dev, const std::function<Tensor()>& run, bool mutated_later) {
  std::vector<Tensor> out = op_multi(kind, dev, [&] { return std::vector<Tensor>{run()}; }, mutated_later);
  if (out.size() != 1) throw std::logic_error("per-op checkpointing: a one-output operator replayed " +
                                              std::to_string(out.size()) + " outputs");
  return out.front();
}

int64_t SavedTensors::stashed_bytes() const {
  int64_t n = 0;
  for (const auto& outs : stash_)
    for (const Tensor& t : outs)
      if (t.defined()) n += int64_t(t.nbytes());
  return n;
}

}  // namespace meshtrain
