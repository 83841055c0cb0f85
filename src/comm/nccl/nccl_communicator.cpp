#include "comm/nccl/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "device/cuda/cuda_device.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at in-flight collectives. Deadlines are seconds long, so this
// only bounds how late an asynchronous NCCL error is noticed; polling costs a cudaEventQuery per
// in-flight collective and one ncclCommGetAsyncError.
constexpr auto kWatchPeriod = std::chrono::milliseconds(10);

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

/// After a query answered cudaErrorNotReady: that answer may sit in the thread's last-error
/// slot, where a later cudaGetLastError (kernel launch checks) would take it for a failure.
/// Only a NotReady is cleared, so a real pending error still surfaces.
void clear_not_ready() {
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

void same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(what) + ": in is " + dtype_name(a.dtype()) + " but out is " +
                                dtype_name(b.dtype()));
}

}  // namespace

struct NcclCommunicator::InFlight {
  const char* what = "";  // collective name for messages, "all_reduce (NCCL)"
  cudaEvent_t event = nullptr;  // recorded on the communication stream right after the collective
  Clock::time_point deadline{};
  bool has_deadline = false;
  double timeout_s = 0;
  InFlight() = default;
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  // Destroying an event whose work is pending is allowed: CUDA releases it once it completes.
  ~InFlight() {
    if (event) (void)cudaEventDestroy(event);
  }
};

struct NcclCommunicator::Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<InFlight>> inflight;  // issue order: the oldest first
  bool stop = false;
  std::thread thread;
};

namespace {

/// Handle of one stream-ordered NCCL collective.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<void> op, cudaEvent_t event, cudaStream_t compute, std::vector<Tensor> keep,
           const char* what, const std::string& group)
      : op_(std::move(op)), event_(event), compute_(compute), keep_(std::move(keep)), what_(what), group_(group) {}
  // Dropped without wait(): order the compute stream after the collective anyway, so releasing
  // the tensors here cannot let a later kernel reuse their memory while NCCL still uses it.
  ~NcclWork() override {
    if (!waited_ && !complete_ && cudaStreamWaitEvent(compute_, event_, 0) != cudaSuccess) (void)cudaGetLastError();
  }
  /// Makes the compute stream wait for the collective (no host block): every kernel, copy or
  /// download queued later sees its result.
  void wait() override {
    if (waited_) return;
    const cudaError_t e = cudaStreamWaitEvent(compute_, event_, 0);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw CommError(std::string(what_) + " on " + group_ + ": cudaStreamWaitEvent failed: " + cudaGetErrorString(e));
    }
    waited_ = true;
    keep_.clear();  // later users of this memory are stream-ordered after the collective now
  }
  bool test() override {
    if (complete_) return true;
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) {
      clear_not_ready();
      return false;
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw CommError(std::string(what_) + " on " + group_ + ": cudaEventQuery failed: " + cudaGetErrorString(e));
    }
    complete_ = true;
    keep_.clear();
    return true;
  }

 private:
  std::shared_ptr<void> op_;  // owns event_ (the InFlight record, shared with the watchdog)
  cudaEvent_t event_;
  cudaStream_t compute_;
  std::vector<Tensor> keep_;
  const char* what_;
  std::string group_;
  bool waited_ = false, complete_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm_t comm, CudaDevice& dev, MpiCommunicator& mpi, std::string name)
    : comm_(comm), dev_(dev), stream_(dev.create_comm_stream()), mpi_(mpi), name_(std::move(name)),
      group_(mpi.describe()), rank_(mpi.rank()), size_(mpi.size()), wd_(std::make_unique<Watchdog>()) {
  int n = 0, r = 0;
  ncclResult_t e = ncclCommCount(comm_, &n);
  if (e == ncclSuccess) e = ncclCommUserRank(comm_, &r);
  if (e != ncclSuccess)
    throw CommError("ncclCommCount / ncclCommUserRank on " + group_ + " failed: " + ncclGetErrorString(e));
  if (n != size_ || r != rank_)
    throw CommError("NCCL communicator of " + group_ + " has " + std::to_string(n) + " ranks with this rank " +
                    std::to_string(r) + ", but its MPI group has " + std::to_string(size_) + " with this rank " +
                    std::to_string(rank_) + " (NcclMesh and MeshCommunicators disagree)");
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(host, &len);
  host_.assign(host, size_t(len));
  wd_->thread = std::thread([this] { watch(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(wd_->mu);
    wd_->stop = true;
  }
  wd_->cv.notify_all();
  if (wd_->thread.joinable()) wd_->thread.join();
}

void NcclCommunicator::fatal(const char* what, const std::string& why, int status) const {
  // Strings only, no MPI query: this runs on the watchdog thread, and MPI is initialized
  // MPI_THREAD_FUNNELED. MPI_Abort from here is the one exception, as it must end the job.
  std::fprintf(stderr, "[rank %d %s] watchdog: %s on %s %s; aborting the job\n", world_rank_, host_.c_str(), what,
               group_.c_str(), why.c_str());
  std::fflush(stderr);
  ncclCommAbort(comm_);  // stops NCCL kernels that wait for a peer, so nothing hangs in the driver
  MpiRuntime::abort_job(status);
}

void NcclCommunicator::watch() {
  // The watchdog thread's CUDA calls must target the GPU the events belong to.
  if (cudaSetDevice(dev_.ordinal()) != cudaSuccess) (void)cudaGetLastError();
  std::unique_lock<std::mutex> lock(wd_->mu);
  for (;;) {
    auto& list = wd_->inflight;
    if (list.empty()) {
      if (wd_->stop) return;  // the destructor waits here until every collective completed
      wd_->cv.wait(lock);
      continue;
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state != ncclSuccess && state != ncclInProgress)  // in progress: the MPI thread is still enqueueing
      fatal(list.front()->what,
            std::string("failed: NCCL error '") + ncclGetErrorString(state) + "' (" + ncclGetLastError(comm_) + ")",
            kExitComm);
    const auto now = Clock::now();
    for (auto it = list.begin(); it != list.end();) {
      const cudaError_t e = cudaEventQuery((*it)->event);
      if (e == cudaSuccess) {
        it = list.erase(it);
        continue;
      }
      if (e != cudaErrorNotReady) {
        // A sticky CUDA error (a faulting kernel) kills the context: nothing will complete, so
        // end the job rather than let the peers wait out their deadlines.
        fatal((*it)->what, std::string("failed: CUDA error '") + cudaGetErrorString(e) + "'", kExitRuntime);
      }
      clear_not_ready();
      if ((*it)->has_deadline && now > (*it)->deadline) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "did not complete within %.0f s (a rank died or hangs)", (*it)->timeout_s);
        fatal((*it)->what, buf, kExitComm);
      }
      ++it;
    }
    wd_->cv.wait_for(lock, kWatchPeriod);
  }
}

void NcclCommunicator::await_enqueued(ncclResult_t r, const char* what, const char* call) {
  if (r == ncclSuccess) return;
  if (r != ncclInProgress)
    throw CommError(std::string(call) + " (" + what + ") on " + group_ + " failed: " + ncclGetErrorString(r) + " (" +
                    ncclGetLastError(comm_) + ")");
  // A non-blocking communicator may return before the operation reached the stream (e.g. while
  // it connects to peers on first use): the stream holds it only once the state leaves
  // ncclInProgress, and the completion event must be recorded after that.
  const auto start = Clock::now();
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess)
      throw CommError(std::string("ncclCommGetAsyncError after ") + call + " (" + what + ") on " + group_ +
                      " failed: " + ncclGetErrorString(q));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)  // the communicator is broken: every rank must stop
      fatal(what, std::string("failed in ") + call + ": NCCL error '" + ncclGetErrorString(state) + "' (" +
                      ncclGetLastError(comm_) + ")",
            kExitComm);
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (timeout_s_ > 0 && waited > timeout_s_) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "did not complete within %.0f s (a rank died or hangs)", timeout_s_);
      fatal(what, buf, kExitComm);
    }
    if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 100))));
  }
}

std::shared_ptr<NcclCommunicator::InFlight> NcclCommunicator::begin(const char* what) {
  auto op = std::make_shared<InFlight>();
  op->what = what;
  // Created before the collective is issued, so a failure here leaves nothing in flight untracked.
  const cudaError_t e = cudaEventCreateWithFlags(&op->event, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    op->event = nullptr;
    throw CommError(std::string(what) + " on " + group_ + ": cudaEventCreateWithFlags failed: " + cudaGetErrorString(e));
  }
  dev_.stream_wait_for_compute(stream_);  // rule 1: the collective sees what the compute stream queued so far
  return op;
}

std::unique_ptr<Work> NcclCommunicator::finish(std::shared_ptr<InFlight> op, ncclResult_t r, const char* call,
                                               std::vector<Tensor> keep) {
  await_enqueued(r, op->what, call);
  const cudaError_t e = cudaEventRecord(op->event, stream_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw CommError(std::string(op->what) + " on " + group_ + ": cudaEventRecord failed: " + cudaGetErrorString(e));
  }
  op->timeout_s = timeout_s_;
  op->has_deadline = timeout_s_ > 0;
  if (op->has_deadline)
    op->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  bool was_idle = false;
  {
    std::lock_guard<std::mutex> lock(wd_->mu);
    was_idle = wd_->inflight.empty();
    wd_->inflight.push_back(op);
  }
  // Only an idle watchdog sleeps without a timeout; a busy one comes round within kWatchPeriod,
  // and waking it per collective would add driver calls competing with kernel launches.
  if (was_idle) wd_->cv.notify_one();
  const cudaEvent_t event = op->event;
  const char* what = op->what;
  return std::make_unique<NcclWork>(std::move(op), event, dev_.compute_stream(), std::move(keep), what, group_);
}

std::unique_ptr<Work> NcclCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  auto f = begin("all_reduce (NCCL)");
  const ncclResult_t r = ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_,
                                       stream_);
  auto w = finish(std::move(f), r, "ncclAllReduce", {t});
  count(CollectiveKind::kAllReduce, int64_t(2 * t.nbytes() * (size_ - 1) / size_));
  return w;
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  if (in.numel() != out.numel() * size_) throw std::invalid_argument("reduce_scatter: in must be size × out");
  same_dtype(in, out, "reduce_scatter");
  auto f = begin("reduce_scatter (NCCL)");
  const ncclResult_t r = ncclReduceScatter(in.raw(), out.raw(), size_t(out.numel()), nccl_type(in.dtype()),
                                           nccl_op(op), comm_, stream_);
  auto w = finish(std::move(f), r, "ncclReduceScatter", {in, out});
  count(CollectiveKind::kReduceScatter, int64_t(in.nbytes() * (size_ - 1) / size_));
  return w;
}

std::unique_ptr<Work> NcclCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  if (out.numel() != in.numel() * size_) throw std::invalid_argument("all_gather: out must be size × in");
  same_dtype(in, out, "all_gather");
  auto f = begin("all_gather (NCCL)");
  const ncclResult_t r =
      ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_type(in.dtype()), comm_, stream_);
  auto w = finish(std::move(f), r, "ncclAllGather", {in, out});
  count(CollectiveKind::kAllGather, int64_t(out.nbytes() * (size_ - 1) / size_));
  return w;
}

std::unique_ptr<Work> NcclCommunicator::broadcast(const Tensor& t, int root) {
  if (root < 0 || root >= size_) throw std::invalid_argument("broadcast: root " + std::to_string(root) + " outside the group");
  auto f = begin("broadcast (NCCL)");
  const ncclResult_t r = ncclBroadcast(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t.dtype()), root, comm_,
                                       stream_);
  auto w = finish(std::move(f), r, "ncclBroadcast", {t});
  if (rank_ == root) count(CollectiveKind::kBroadcast, int64_t(t.nbytes()));
  return w;
}

std::unique_ptr<Work> NcclCommunicator::send(const Tensor& t, int peer, int /*tag: NCCL has none*/) {
  if (peer < 0 || peer >= size_) throw std::invalid_argument("send: peer " + std::to_string(peer) + " outside the group");
  auto f = begin("send (NCCL)");
  const ncclResult_t r = ncclSend(t.raw(), size_t(t.numel()), nccl_type(t.dtype()), peer, comm_, stream_);
  auto w = finish(std::move(f), r, "ncclSend", {t});
  count(CollectiveKind::kSendRecv, int64_t(t.nbytes()));
  return w;
}

std::unique_ptr<Work> NcclCommunicator::recv(const Tensor& t, int peer, int /*tag: NCCL has none*/) {
  if (peer < 0 || peer >= size_) throw std::invalid_argument("recv: peer " + std::to_string(peer) + " outside the group");
  auto f = begin("recv (NCCL)");
  const ncclResult_t r = ncclRecv(t.raw(), size_t(t.numel()), nccl_type(t.dtype()), peer, comm_, stream_);
  return finish(std::move(f), r, "ncclRecv", {t});
}

std::vector<std::unique_ptr<Work>> NcclCommunicator::send_recv_batch(const std::vector<P2POp>& ops) {
  std::vector<std::unique_ptr<Work>> works;
  if (ops.empty()) return works;
  for (const P2POp& op : ops)
    if (op.peer < 0 || op.peer >= size_)
      throw std::invalid_argument(std::string(op.send ? "send" : "recv") + ": peer " + std::to_string(op.peer) +
                                  " outside the group");
  auto f = begin("send_recv batch (NCCL)");
  const std::shared_ptr<InFlight> shared = f;
  const auto accepted = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
  ncclResult_t result = ncclGroupStart();
  const char* call = "ncclGroupStart";
  if (accepted(result)) {
    for (const P2POp& op : ops) {
      const Tensor& t = op.tensor;
      const ncclResult_t r = op.send ? ncclSend(t.raw(), size_t(t.numel()), nccl_type(t.dtype()), op.peer, comm_,
                                                stream_)
                                     : ncclRecv(t.raw(), size_t(t.numel()), nccl_type(t.dtype()), op.peer, comm_,
                                                stream_);
      if (!accepted(r)) {
        result = r, call = op.send ? "ncclSend" : "ncclRecv";
        break;
      }
    }
    const ncclResult_t end = ncclGroupEnd();  // always closed, as in all_to_all
    if (accepted(result)) result = end, call = "ncclGroupEnd";
  }
  works.push_back(finish(std::move(f), result, call, {ops[0].tensor}));
  for (size_t i = 1; i < ops.size(); ++i)
    works.push_back(std::make_unique<NcclWork>(shared, shared->event, dev_.compute_stream(),
                                               std::vector<Tensor>{ops[i].tensor}, shared->what, group_));
  for (const P2POp& op : ops)
    if (op.send) count(CollectiveKind::kSendRecv, int64_t(op.tensor.nbytes()));
  return works;
}

namespace {

// Posts one NCCL group holding, for every peer p, a send of send_elems[p] elements from src at
// the running send offset and a receive of recv_elems[p] into dst at the running receive offset
// (empty blocks post nothing). One group, so all transfers progress together (separate sends and
// receives on one stream would wait for each other). Once opened, the group is always closed,
// even after a failed call, so NCCL's per-thread group state stays balanced. Returns the first
// failure and names its call in `call`.
ncclResult_t post_exchange(const char* src, const std::vector<size_t>& send_elems, char* dst,
                           const std::vector<size_t>& recv_elems, ncclDataType_t type, size_t elem_bytes,
                           ncclComm_t comm, cudaStream_t stream, const char** call) {
  const auto accepted = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
  ncclResult_t result = ncclGroupStart();
  *call = "ncclGroupStart";
  if (!accepted(result)) return result;
  size_t so = 0, ro = 0;
  for (int p = 0; p < int(send_elems.size()); ++p) {
    const size_t sn = send_elems[size_t(p)], rn = recv_elems[size_t(p)];
    if (sn > 0) {
      const ncclResult_t rc = ncclSend(src + so * elem_bytes, sn, type, p, comm, stream);
      if (!accepted(rc)) {
        result = rc, *call = "ncclSend";
        break;
      }
    }
    if (rn > 0) {
      const ncclResult_t rc = ncclRecv(dst + ro * elem_bytes, rn, type, p, comm, stream);
      if (!accepted(rc)) {
        result = rc, *call = "ncclRecv";
        break;
      }
    }
    so += sn;
    ro += rn;
  }
  const ncclResult_t end = ncclGroupEnd();
  if (accepted(result)) result = end, *call = "ncclGroupEnd";  // the first error is the one reported
  return result;
}

}  // namespace

std::unique_ptr<Work> NcclCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows,
                                                     const Tensor& out, const std::vector<int64_t>& recv_rows) {
  const int64_t row = all_to_all_v_row_elems(in, send_rows, out, recv_rows, size_);
  auto f = begin("all_to_all_v (NCCL)");
  const size_t ranks = static_cast<size_t>(size_);
  std::vector<size_t> send(ranks), recv(ranks);
  int64_t bytes = 0;
  for (int p = 0; p < size_; ++p) {
    send[size_t(p)] = size_t(send_rows[size_t(p)] * row);
    recv[size_t(p)] = size_t(recv_rows[size_t(p)] * row);
    if (p != rank_) bytes += int64_t(send[size_t(p)] * dtype_size(in.dtype()));
  }
  const char* call = nullptr;
  const ncclResult_t result = post_exchange(static_cast<const char*>(in.raw()), send, static_cast<char*>(out.raw()),
                                            recv, nccl_type(in.dtype()), dtype_size(in.dtype()), comm_,
                                            stream_, &call);
  auto w = finish(std::move(f), result, call, {in, out});
  count(CollectiveKind::kAllToAll, bytes);
  return w;
}

std::unique_ptr<Work> NcclCommunicator::all_to_all(const Tensor& in, const Tensor& out) {
  if (in.numel() != out.numel() || in.numel() % size_) throw std::invalid_argument("all_to_all: sizes");
  same_dtype(in, out, "all_to_all");
  auto f = begin("all_to_all (NCCL)");
  const std::vector<size_t> blocks(size_t(size_), size_t(in.numel() / size_));
  const char* call = nullptr;
  const ncclResult_t result = post_exchange(static_cast<const char*>(in.raw()), blocks, static_cast<char*>(out.raw()),
                                            blocks, nccl_type(in.dtype()), dtype_size(in.dtype()), comm_,
                                            stream_, &call);
  auto w = finish(std::move(f), result, call, {in, out});
  count(CollectiveKind::kAllToAll, int64_t(in.nbytes() * (size_ - 1) / size_));
  return w;
}

void NcclCommunicator::barrier() { mpi_.barrier(); }

void NcclCommunicator::all_reduce_host(double* values, int n, ReduceOp op) { mpi_.all_reduce_host(values, n, op); }

}  // namespace meshtrain
