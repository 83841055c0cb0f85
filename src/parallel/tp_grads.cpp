#include "parallel/tp_grads.hpp"

namespace meshtrain {

int64_t tp_partial_grad_elems(const std::vector<LocalShard>& shards) {
  int64_t n = 0;
  for (const LocalShard& ls : shards)
    if (ls.param->sharding.tp_partial_grad) n += ls.grad.numel();
  return n;
}

void reduce_tp_partial_grads(Device& dev, Communicator& tp, const std::vector<LocalShard>& shards,
                             int64_t chunk_elems) {
  if (tp.size() == 1 || tp_partial_grad_elems(shards) == 0) return;
  std::vector<const LocalShard*> pack;  // small shards waiting for the packed all-reduce
  int64_t packed = 0;
  auto flush = [&]() {
    if (pack.empty()) return;
    Tensor buf = dev.empty({packed}, DType::kF32, MemCategory::kCommunication);
    int64_t off = 0;
    for (const LocalShard* ls : pack) {
      dev.copy(buf.view({ls->grad.numel()}, off), ls->grad);
      off += ls->grad.numel();
    }
    tp.all_reduce(buf, ReduceOp::kSum)->wait();
    off = 0;
    for (const LocalShard* ls : pack) {
      dev.copy(ls->grad, buf.view({ls->grad.numel()}, off));
      off += ls->grad.numel();
    }
    pack.clear();
    packed = 0;
  };
  for (const LocalShard& ls : shards) {
    const int64_t n = ls.grad.numel();
    if (!ls.param->sharding.tp_partial_grad || n == 0) continue;
    if (n > chunk_elems) {  // a whole chunk by itself: in place, no copy
      tp.all_reduce(ls.grad, ReduceOp::kSum)->wait();
      continue;
    }
    if (packed + n > chunk_elems) flush();
    pack.push_back(&ls);
    packed += n;
  }
  flush();
}

}  // namespace meshtrain
