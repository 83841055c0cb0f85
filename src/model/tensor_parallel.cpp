#include "model/tensor_parallel.hpp"

#include <stdexcept>
#include <string>

#include "model/parameter.hpp"

namespace meshtrain {

int64_t tp_local_tokens(const TensorParallel& tp, int64_t tokens) {
  if (!tp.active() || !tp.sequence_parallel) return tokens;
  if (tokens % tp.size)
    throw std::invalid_argument("sequence parallelism: " + std::to_string(tokens) + " tokens do not divide over tp " +
                                std::to_string(tp.size));
  return tokens / tp.size;
}

Tensor tp_enter(Device& dev, const TensorParallel& tp, const Tensor& x) {
  if (!tp.active() || !tp.sequence_parallel) return x;
  Tensor full = dev.empty({x.dim(0) * tp.size, x.dim(1)}, x.dtype(), MemCategory::kActivations);
  tp.comm->all_gather(x, full)->wait();
  return full;
}

Tensor tp_exit(Device& dev, const TensorParallel& tp, const Tensor& partial) {
  if (!tp.active()) return partial;
  if (!tp.sequence_parallel) {
    tp.comm->all_reduce(partial, ReduceOp::kSum)->wait();
    return partial;
  }
  Tensor shard = dev.empty({tp_local_tokens(tp, partial.dim(0)), partial.dim(1)}, partial.dtype(), MemCategory::kActivations);
  tp.comm->reduce_scatter(partial, shard, ReduceOp::kSum)->wait();
  return shard;
}

namespace {

double vocab_parallel_ce(Device& dev, const TensorParallel& tp, const Tensor& logits, const Tensor& targets,
                         int64_t vocab_start, int64_t vocab_size, const Tensor& dlogits, float grad_scale) {
  const int64_t n = logits.dim(0);
  Tensor stats = dev.empty({n, 3}, DType::kF32, MemCategory::kTemporaries);
  dev.cross_entropy_partial(logits, targets, vocab_start, vocab_size, stats);
  Tensor all = dev.empty({tp.size, n, 3}, DType::kF32, MemCategory::kTemporaries);
  tp.comm->all_gather(stats, all)->wait();
  Tensor lse = dev.empty({n}, DType::kF32, MemCategory::kTemporaries);
  const double loss = dev.cross_entropy_combine(all, lse);
  if (dlogits.defined()) dev.cross_entropy_grad(logits, targets, vocab_start, lse, dlogits, grad_scale);
  return loss;
}

double gathered_ce(Device& dev, const TensorParallel& tp, const Tensor& logits, const Tensor& targets,
                   int64_t vocab_size, const Tensor& dlogits, float grad_scale) {
  // Every rank sends ⌈V/tp⌉ columns (the last slab may be narrower), so the gather is even.
  const int64_t n = logits.dim(0), per = chunk_range(vocab_size, tp.size, 0).second;
  Tensor send = dev.empty({n, per}, logits.dtype(), MemCategory::kTemporaries);
  dev.copy_columns(send, 0, logits, 0, logits.dim(1));
  Tensor all = dev.empty({tp.size * n * per}, logits.dtype(), MemCategory::kTemporaries);
  tp.comm->all_gather(send, all)->wait();
  Tensor full = dev.empty({n, vocab_size}, logits.dtype(), MemCategory::kTemporaries);
  for (int64_t r = 0; r < tp.size; ++r) {
    const auto [first, count] = chunk_range(vocab_size, tp.size, r);
    dev.copy_columns(full, first, all.view({n, per}, r * n * per), 0, count);
  }
  const double loss = dev.cross_entropy(full, targets, dlogits.defined() ? full : Tensor(), grad_scale);
  if (dlogits.defined()) {
    const auto [first, count] = chunk_range(vocab_size, tp.size, tp.rank);
    dev.copy_columns(dlogits, 0, full, first, count);
  }
  return loss;
}

}  // namespace

double tp_cross_entropy(Device& dev, const TensorParallel& tp, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_start, int64_t vocab_size, const Tensor& dlogits, float grad_scale) {
  if (!tp.active()) return dev.cross_entropy(logits, targets, dlogits, grad_scale);
  if (tp.loss_parallel) return vocab_parallel_ce(dev, tp, logits, targets, vocab_start, vocab_size, dlogits, grad_scale);
  return gathered_ce(dev, tp, logits, targets, vocab_size, dlogits, grad_scale);
}

}  // namespace meshtrain
