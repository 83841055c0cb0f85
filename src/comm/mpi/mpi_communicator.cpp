#include "comm/mpi/mpi_communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include <stdexcept>

#include "tensor/bf16.hpp"
#include "util/errors.hpp"

namespace meshtrain {

namespace {

void check(int rc, const char* what, const std::string& group) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError(std::string(what) + " on group '" + group + "' failed: " + std::string(msg, len));
}

MPI_Datatype mpi_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kI32: return MPI_INT32_T;
    case DType::kBF16: return MPI_UINT16_T;  // MPI has no bfloat16: raw bits, reduced by the user ops below
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

// bfloat16 reductions on MPI_UINT16_T bit patterns. Each pair is widened to float (exact),
// combined, and the sum rounded back to nearest-even, as NCCL's bf16 reduction does per step.
// Pairwise rounding makes the sum depend on MPI's combination order like any low-precision
// reduction; max and min return one of the inputs unchanged (NaN wins, so it is not hidden).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_from_float(float_from_bf16(a[i]) + float_from_bf16(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = float_from_bf16(a[i]), y = float_from_bf16(b[i]);
    if (std::isnan(x) || x > y) b[i] = a[i];
  }
}
void bf16_min(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = float_from_bf16(a[i]), y = float_from_bf16(b[i]);
    if (std::isnan(x) || x < y) b[i] = a[i];
  }
}

// Created at first use (on the thread that calls MPI: MPI_THREAD_FUNNELED), freed by
// ~MpiRuntime before MPI_Finalize. Indexed by ReduceOp.
std::array<MPI_Op, 3>& bf16_ops() {
  static std::array<MPI_Op, 3> ops = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  return ops;
}

void free_bf16_ops() {
  for (MPI_Op& o : bf16_ops())
    if (o != MPI_OP_NULL) MPI_Op_free(&o);  // sets o to MPI_OP_NULL
}

/// The MPI reduction of `op` on tensors of dtype `d` (a user-defined op for bf16).
MPI_Op reduce_op(ReduceOp op, DType d, const std::string& group) {
  if (d != DType::kBF16) return mpi_op(op);
  MPI_Op& o = bf16_ops()[size_t(op)];
  if (o == MPI_OP_NULL) {
    MPI_User_function* fn = op == ReduceOp::kSum ? bf16_sum : op == ReduceOp::kMax ? bf16_max : bf16_min;
    check(MPI_Op_create(fn, /*commute=*/1, &o), "MPI_Op_create (bfloat16)", group);
  }
  return o;
}

// Waits for `req` until `timeout_s` passes; then the watchdog names the collective and group on
// stderr and aborts the whole job (MPI_Abort), so a dead or stuck rank never hangs the others.
// Polls with a growing sleep (up to 1 ms) instead of MPI_Wait's busy loop, which also leaves the
// core to the ranks still computing when ranks are oversubscribed.
void wait_with_deadline(MPI_Request* req, const char* what, const std::string& group, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  int done = 0;
  for (int polls = 0;; ++polls) {
    check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what, group);
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      char host[MPI_MAX_PROCESSOR_NAME];
      int len = 0;
      MPI_Get_processor_name(host, &len);
      std::fprintf(stderr,
                   "[rank %d %.*s] watchdog: %s on %s did not complete within %.0f s (a rank died or hangs); "
                   "aborting the job\n",
                   rank, len, host, what, group.c_str(), timeout_s);
      std::fflush(stderr);
      MpiRuntime::abort_job(kExitComm);
    }
    if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 100))));
  }
}

class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request req, const char* what, std::string group, double timeout_s)
      : req_(req), what_(what), group_(std::move(group)), timeout_s_(timeout_s) {}
  ~MpiWork() override {
    if (req_ != MPI_REQUEST_NULL) wait_with_deadline(&req_, what_, group_, timeout_s_);  // never leave a buffer in flight
  }
  void wait() override { wait_with_deadline(&req_, what_, group_, timeout_s_); }
  bool test() override {
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), what_, group_);
    return done != 0;
  }

 private:
  MPI_Request req_;
  const char* what_;
  std::string group_;
  double timeout_s_;
};

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, len);
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    free_bf16_ops();
    MPI_Finalize();
  }
}

void MpiRuntime::abort_job(int status) {
  int init = 0;
  MPI_Initialized(&init);
  if (init) MPI_Abort(MPI_COMM_WORLD, status);
  _exit(status);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : name_(std::move(name)) {
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", name_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key, const std::string& name) const {
  MPI_Comm sub;
  check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", name);
  auto out = std::make_unique<MpiCommunicator>(sub, name);
  out->group_ = color;
  MPI_Comm_free(&sub);
  return out;
}

std::unique_ptr<Work> MpiCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  MPI_Request r;
  check(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), int(t.numel()), mpi_type(t), reduce_op(op, t.dtype(), name_), comm_, &r),
        "all_reduce", name_);
  count(CollectiveKind::kAllReduce, int64_t(2 * t.nbytes() * (size_ - 1) / size_));
  return std::make_unique<MpiWork>(r, "all_reduce", describe(), timeout_s_);
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  if (in.numel() != out.numel() * size_) throw std::invalid_argument("reduce_scatter: in must be size × out");
  if (in.dtype() != out.dtype()) throw std::invalid_argument("reduce_scatter: in and out must have one dtype");
  MPI_Request r;
  check(MPI_Ireduce_scatter_block(in.raw(), out.raw(), int(out.numel()), mpi_type(in),
                                  reduce_op(op, in.dtype(), name_), comm_, &r),
        "reduce_scatter", name_);
  count(CollectiveKind::kReduceScatter, int64_t(in.nbytes() * (size_ - 1) / size_));
  return std::make_unique<MpiWork>(r, "reduce_scatter", describe(), timeout_s_);
}

std::unique_ptr<Work> MpiCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  if (out.numel() != in.numel() * size_) throw std::invalid_argument("all_gather: out must be size × in");
  MPI_Request r;
  check(MPI_Iallgather(in.raw(), int(in.numel()), mpi_type(in), out.raw(), int(in.numel()), mpi_type(out), comm_, &r),
        "all_gather", name_);
  count(CollectiveKind::kAllGather, int64_t(out.nbytes() * (size_ - 1) / size_));
  return std::make_unique<MpiWork>(r, "all_gather", describe(), timeout_s_);
}

std::unique_ptr<Work> MpiCommunicator::broadcast(const Tensor& t, int root) {
  MPI_Request r;
  check(MPI_Ibcast(t.raw(), int(t.numel()), mpi_type(t), root, comm_, &r), "broadcast", name_);
  if (rank_ == root) count(CollectiveKind::kBroadcast, int64_t(t.nbytes()));
  return std::make_unique<MpiWork>(r, "broadcast", describe(), timeout_s_);
}

std::unique_ptr<Work> MpiCommunicator::send(const Tensor& t, int peer, int tag) {
  MPI_Request r;
  check(MPI_Isend(t.raw(), int(t.numel()), mpi_type(t), peer, tag, comm_, &r), "send", name_);
  count(CollectiveKind::kSendRecv, int64_t(t.nbytes()));
  return std::make_unique<MpiWork>(r, "send", describe(), timeout_s_);
}

std::unique_ptr<Work> MpiCommunicator::recv(const Tensor& t, int peer, int tag) {
  MPI_Request r;
  check(MPI_Irecv(t.raw(), int(t.numel()), mpi_type(t), peer, tag, comm_, &r), "recv", name_);
  return std::make_unique<MpiWork>(r, "recv", describe(), timeout_s_);
}

std::unique_ptr<Work> MpiCommunicator::all_to_all(const Tensor& in, const Tensor& out) {
  if (in.numel() != out.numel() || in.numel() % size_) throw std::invalid_argument("all_to_all: sizes");
  MPI_Request r;
  const int n = int(in.numel() / size_);
  check(MPI_Ialltoall(in.raw(), n, mpi_type(in), out.raw(), n, mpi_type(out), comm_, &r), "all_to_all", name_);
  count(CollectiveKind::kAllToAll, int64_t(in.nbytes() * (size_ - 1) / size_));
  return std::make_unique<MpiWork>(r, "all_to_all", describe(), timeout_s_);
}

void MpiCommunicator::barrier() {
  MPI_Request r;
  check(MPI_Ibarrier(comm_, &r), "barrier", name_);
  wait_with_deadline(&r, "barrier", describe(), timeout_s_);
}

void MpiCommunicator::all_reduce_host(double* values, int n, ReduceOp op) {
  MPI_Request r;
  check(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, mpi_op(op), comm_, &r), "all_reduce", name_);
  wait_with_deadline(&r, "all_reduce (host scalars)", describe(), timeout_s_);
}

std::string MpiCommunicator::describe() const {
  return "dimension '" + name_ + "'" + (group_ >= 0 ? " group " + std::to_string(group_) : std::string()) + " (" +
         std::to_string(size_) + " ranks, this rank " + std::to_string(rank_) + ")";
}

}  // namespace meshtrain
