#include "parallel/tp_grads.hpp"

namespace meshtrain {

int64_t tp_partial_grad_elems(const std::vector<LocalShard>& shards) {
  int64_t n = 0;
  for (const LocalShard& ls : shards)
    if (ls.param->sharding.tp_partial_grad) n += ls.grad.numel();
  return n;
}

void reduce_tp_partial_grads(Device& dev, Communicator& tp, const std::vector<LocalShard>& shards) {
  const int64_t total = tp_partial_grad_elems(shards);
  if (tp.size() == 1 || total == 0) return;
  // One packed all-reduce: these tensors are small ([D], [Dh]) and many (2 per block).
  Tensor buf = dev.empty({total}, DType::kF32, MemCategory::kCommunication);
  int64_t off = 0;
  for (const LocalShard& ls : shards)
    if (ls.param->sharding.tp_partial_grad && ls.grad.numel() > 0) {
      dev.copy(buf.view({ls.grad.numel()}, off), ls.grad);
      off += ls.grad.numel();
    }
  tp.all_reduce(buf, ReduceOp::kSum)->wait();
  off = 0;
  for (const LocalShard& ls : shards)
    if (ls.param->sharding.tp_partial_grad && ls.grad.numel() > 0) {
      dev.copy(ls.grad, buf.view({ls.grad.numel()}, off));
      off += ls.grad.numel();
    }
}

}  // namespace meshtrain
