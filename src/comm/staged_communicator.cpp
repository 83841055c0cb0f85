#include "comm/staged_communicator.hpp"

#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace meshtrain {

namespace {

void* host_alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);  // aligned_alloc needs a multiple of the alignment
  return p;  // nullptr makes CachingAllocator release its cache, retry, then throw std::bad_alloc
}
void host_free(void* p, size_t) { std::free(p); }

void same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(what) + ": in is " + dtype_name(a.dtype()) + " but out is " +
                                dtype_name(b.dtype()));
}

/// An MPI collective on host buffers plus the upload of its result into the device tensor.
class StagedWork final : public Work {
 public:
  StagedWork(std::shared_ptr<CachingAllocator> alloc, Device& dev, std::unique_ptr<Work> inner, Tensor input_host,
             Tensor result_host, Tensor result_dev)
      : alloc_(std::move(alloc)),
        dev_(dev),
        input_host_(std::move(input_host)),
        result_host_(std::move(result_host)),
        result_dev_(std::move(result_dev)),
        inner_(std::move(inner)) {}
  ~StagedWork() override {
    if (done_) return;
    try {
      wait();  // MPI must stop using the host buffers before they are freed, and MPI semantics deliver the result
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    complete();
  }
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    complete();
    return true;
  }

 private:
  void complete() {
    done_ = true;  // first: an upload that throws must not be retried by the destructor
    if (result_dev_.defined()) dev_.upload(result_dev_, result_host_.raw(), result_dev_.nbytes());
    // The upload copied the bytes (CudaDevice stages them into pinned memory), so the host
    // buffers can go back to the cache now rather than when the Work dies.
    input_host_ = Tensor();
    result_host_ = Tensor();
    result_dev_ = Tensor();
  }

  // Declaration order is destruction order reversed: inner_ (whose destructor waits for MPI)
  // goes before the host buffers it uses, and those before the allocator they return to.
  std::shared_ptr<CachingAllocator> alloc_;
  Device& dev_;
  Tensor input_host_, result_host_, result_dev_;
  std::unique_ptr<Work> inner_;
  bool done_ = false;
};

}  // namespace

StagedCommunicator::StagedCommunicator(MpiCommunicator& mpi, Device& dev)
    : mpi_(mpi), dev_(dev), host_(std::make_shared<CachingAllocator>(host_alloc, host_free)) {}

Tensor StagedCommunicator::host_like(const Tensor& t) {
  return Tensor::empty(host_.get(), {t.numel()}, t.dtype(), MemCategory::kCommunication);
}

std::unique_ptr<Work> StagedCommunicator::staged(std::unique_ptr<Work> inner, Tensor input_host, Tensor result_host,
                                                 Tensor result_dev) {
  return std::make_unique<StagedWork>(host_, dev_, std::move(inner), std::move(input_host), std::move(result_host),
                                      std::move(result_dev));
}

void StagedCommunicator::absorb(const std::array<int64_t, int(CollectiveKind::kCount)>& before) {
  const auto& now = mpi_.bytes_sent();
  for (int k = 0; k < int(CollectiveKind::kCount); ++k) count(CollectiveKind(k), now[size_t(k)] - before[size_t(k)]);
}

std::unique_ptr<Work> StagedCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  Tensor h = host_like(t);
  dev_.download(h.raw(), t, t.nbytes());
  const auto before = mpi_.bytes_sent();
  auto inner = mpi_.all_reduce(h, op);
  absorb(before);
  return staged(std::move(inner), Tensor(), h, t);
}

std::unique_ptr<Work> StagedCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  if (in.numel() != out.numel() * size()) throw std::invalid_argument("reduce_scatter: in must be size × out");
  same_dtype(in, out, "reduce_scatter");
  Tensor hin = host_like(in), hout = host_like(out);
  dev_.download(hin.raw(), in, in.nbytes());
  const auto before = mpi_.bytes_sent();
  auto inner = mpi_.reduce_scatter(hin, hout, op);
  absorb(before);
  return staged(std::move(inner), hin, hout, out);
}

std::unique_ptr<Work> StagedCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  if (out.numel() != in.numel() * size()) throw std::invalid_argument("all_gather: out must be size × in");
  same_dtype(in, out, "all_gather");
  Tensor hin = host_like(in), hout = host_like(out);
  dev_.download(hin.raw(), in, in.nbytes());
  const auto before = mpi_.bytes_sent();
  auto inner = mpi_.all_gather(hin, hout);
  absorb(before);
  return staged(std::move(inner), hin, hout, out);
}

std::unique_ptr<Work> StagedCommunicator::broadcast(const Tensor& t, int root) {
  Tensor h = host_like(t);
  const bool is_root = rank() == root;
  if (is_root) dev_.download(h.raw(), t, t.nbytes());
  const auto before = mpi_.bytes_sent();
  auto inner = mpi_.broadcast(h, root);
  absorb(before);
  // The root's tensor already holds the data: nothing to upload there.
  return staged(std::move(inner), Tensor(), h, is_root ? Tensor() : t);
}

std::unique_ptr<Work> StagedCommunicator::send(const Tensor& t, int peer, int tag) {
  Tensor h = host_like(t);
  dev_.download(h.raw(), t, t.nbytes());
  const auto before = mpi_.bytes_sent();
  auto inner = mpi_.send(h, peer, tag);
  absorb(before);
  return staged(std::move(inner), h, Tensor(), Tensor());
}

std::unique_ptr<Work> StagedCommunicator::recv(const Tensor& t, int peer, int tag) {
  Tensor h = host_like(t);
  auto inner = mpi_.recv(h, peer, tag);  // receives count nothing (MpiCommunicator)
  return staged(std::move(inner), Tensor(), h, t);
}

std::unique_ptr<Work> StagedCommunicator::all_to_all(const Tensor& in, const Tensor& out) {
  if (in.numel() != out.numel() || in.numel() % size()) throw std::invalid_argument("all_to_all: sizes");
  same_dtype(in, out, "all_to_all");
  Tensor hin = host_like(in), hout = host_like(out);
  dev_.download(hin.raw(), in, in.nbytes());
  const auto before = mpi_.bytes_sent();
  auto inner = mpi_.all_to_all(hin, hout);
  absorb(before);
  return staged(std::move(inner), hin, hout, out);
}

std::unique_ptr<Work> StagedCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows,
                                                       const Tensor& out, const std::vector<int64_t>& recv_rows) {
  all_to_all_v_row_elems(in, send_rows, out, recv_rows, size());
  // The host copies keep the row shape: the counts are in rows.
  Tensor hin = host_like(in).reshape(in.shape()), hout = host_like(out).reshape(out.shape());
  dev_.download(hin.raw(), in, in.nbytes());
  const auto before = mpi_.bytes_sent();
  auto inner = mpi_.all_to_all_v(hin, send_rows, hout, recv_rows);
  absorb(before);
  return staged(std::move(inner), hin, hout, out);
}

}  // namespace meshtrain
