#include "parallel/data_parallel.hpp"

#include <chrono>

#include "util/trace.hpp"

namespace meshtrain {

DataParallel::DataParallel(Transformer& model, Communicator& comm, int64_t bucket_bytes, DType reduce_dtype)
    : model_(model), comm_(comm), reduce_dtype_(reduce_dtype) {
  shards_ = replicated_shards(model);
  const auto& units = model.units();
  const Tensor& flat = model.flat_grads();
  const int64_t total = flat.numel();
  bucket_of_unit_.assign(units.size(), -1);
  // Units are packed from the last (first to finish backward) to the first.
  auto unit_begin = [&](size_t u) {
    auto ps = model.unit_parameters(u);
    return ps.empty() ? -1 : ps.front()->flat_offset;
  };
  int64_t end = total;
  size_t last = units.size() - 1;
  for (size_t u = units.size(); u-- > 0;) {
    const int64_t begin = unit_begin(u);
    if (begin < 0) continue;
    if ((end - begin) * 4 >= bucket_bytes || u == 0) {
      buckets_.push_back({u, last, flat.view({end - begin}, begin)});
      for (size_t v = u; v <= last; ++v) bucket_of_unit_[v] = int(buckets_.size() - 1);
      end = begin;
      last = u - 1;
    }
  }
  reported_.assign(buckets_.size(), 0);
}

void DataParallel::post_backward(size_t unit, int64_t) {
  if (!sync_ || comm_.size() == 1) return;
  const int b = bucket_of_unit_[unit];
  // A bucket goes once all its units' gradients are final: without pipeline parallelism that
  // is its first unit (backward runs in reverse), but a pipeline rank's stages, and a
  // zero-bubble schedule's deferred weight gradients, may finish them in another order.
  if (b >= 0 && ++reported_[size_t(b)] == buckets_[b].last_unit - buckets_[b].first_unit + 1) {
    reported_[size_t(b)] = 0;
    InFlight f;
    Tensor t = buckets_[b].grads;
    if (reduce_dtype_ == DType::kBF16) {
      Device& dev = model_.device();
      f.wire = dev.empty(t.shape(), DType::kBF16, MemCategory::kCommunication);
      f.target = t;
      dev.cast(f.wire, t);
      t = f.wire;
    }
    trace::Span span("issue all_reduce", "comm_issue");
    span.arg("unit", unit).arg("bytes", int64_t(t.nbytes())).arg("group", comm_.name());
    f.work = comm_.all_reduce(t, ReduceOp::kSum);
    pending_.push_back(std::move(f));
  }
  poll();
}

void DataParallel::poll() {
  for (auto& f : pending_) f.work->test();
}

void DataParallel::finish() {
  trace::Span span("wait gradient all_reduce", "comm_wait");
  span.arg("buckets", pending_.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& f : pending_) {
    f.work->wait();
    if (f.wire.defined()) model_.device().cast(f.target, f.wire);
  }
  pending_.clear();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double DataParallel::grad_sum_squares(Device& dev, std::vector<double>* each) {
  return local_sum_squares(dev, shards_, each);
}

double DataParallel::take_comm_wait_seconds() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

std::vector<int64_t> DataParallel::bucket_sizes() const {
  std::vector<int64_t> out;
  for (const auto& b : buckets_) out.push_back(b.grads.numel());
  return out;
}

}  // namespace meshtrain
