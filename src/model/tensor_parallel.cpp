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

int64_t tp_loss_shards(const TensorParallel& tp) { return tp.active() && tp.loss_parallel ? tp.size : 1; }

namespace {

// The full logits [c, V] of a chunk from every rank's column slab (loss_parallel off).
Tensor gather_logits(Device& dev, const TensorParallel& tp, const Tensor& logits, int64_t vocab_size) {
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
  return full;
}

}  // namespace

void tp_cross_entropy_stats(Device& dev, const TensorParallel& tp, const Tensor& logits, const Tensor& targets,
                            int64_t vocab_start, int64_t vocab_size, const Tensor& stats, int64_t row0,
                            const Tensor& lse) {
  const int64_t c = logits.dim(0), p = stats.dim(0), n = stats.dim(1);
  if (p != tp_loss_shards(tp) || row0 < 0 || row0 + c > n)
    throw std::invalid_argument("tp_cross_entropy_stats: stats [" + std::to_string(p) + ", " + std::to_string(n) +
                                ", 3] cannot hold rows [" + std::to_string(row0) + ", " + std::to_string(row0 + c) +
                                ") of " + std::to_string(tp_loss_shards(tp)) + " shards");
  if (p == 1) {
    // One shard of statistics: the single-rank kernel on the whole vocabulary (gathered when tp
    // splits it). With P = 1, combine's Σ s·exp(m − m) is s·1 exactly, so lse = m + log s is
    // bitwise Device::cross_entropy's.
    Tensor rows = stats.view({c, 3}, row0 * 3);
    if (tp.active())
      dev.cross_entropy_partial(gather_logits(dev, tp, logits, vocab_size), targets, 0, vocab_size, rows);
    else
      dev.cross_entropy_partial(logits, targets, vocab_start, vocab_size, rows);
    dev.cross_entropy_combine(stats.view({1, c, 3}, row0 * 3), lse);
    return;
  }
  Tensor mine = dev.empty({c, 3}, DType::kF32, MemCategory::kTemporaries);
  dev.cross_entropy_partial(logits, targets, vocab_start, vocab_size, mine);
  // The chunk's [P, c, 3] triples; copied into the stats' P slabs unless they are the whole N.
  Tensor all = c == n ? stats : dev.empty({p, c, 3}, DType::kF32, MemCategory::kTemporaries);
  tp.comm->all_gather(mine, all)->wait();
  dev.cross_entropy_combine(all, lse);
  if (c != n)
    for (int64_t r = 0; r < p; ++r) dev.copy(stats.view({c, 3}, (r * n + row0) * 3), all.view({c, 3}, r * c * 3));
}

double tp_cross_entropy(Device& dev, const TensorParallel& tp, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_start, int64_t vocab_size, const Tensor& dlogits, float grad_scale) {
  const int64_t n = logits.dim(0);
  Tensor stats = dev.empty({tp_loss_shards(tp), n, 3}, DType::kF32, MemCategory::kTemporaries);
  Tensor lse = dev.empty({n}, DType::kF32, MemCategory::kTemporaries);
  tp_cross_entropy_stats(dev, tp, logits, targets, vocab_start, vocab_size, stats, 0, lse);
  const double loss = dev.cross_entropy_combine(stats, lse);
  if (dlogits.defined()) dev.cross_entropy_grad(logits, targets, vocab_start, lse, dlogits, grad_scale, 0.0f);
  return loss;
}

}  // namespace meshtrain
