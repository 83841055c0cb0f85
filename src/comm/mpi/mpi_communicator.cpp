#include "comm/mpi/mpi_communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/mpi/crash_report.hpp"
#include "comm/mpi/mpi_chunking.hpp"
#include "tensor/bf16.hpp"
#include "util/errors.hpp"
#include "util/trace.hpp"

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

// Prints which collective on which group missed its deadline and aborts the whole job
// (MPI_Abort), so a dead or stuck rank never hangs the others.
[[noreturn]] void deadline_passed(const char* what, const std::string& group, double timeout_s) {
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

/// Every MPI request of one Communicator call (one per chunk, mpi_chunking.hpp) under one
/// deadline, and the derived datatypes they use. Open MPI's non-blocking collectives read a
/// datatype until they complete, so the types are freed only then. When tracing
/// (util/trace.hpp), the call is an async "collective" interval from construction (issue) to the
/// first test() that sees it complete, and a blocking wait() a "comm_wait" span.
class MpiWork final : public Work {
 public:
  /// `what` (a string literal) and `group` (MpiCommunicator::describe()) name the call in errors
  /// and watchdog messages; `timeout_s` <= 0 waits forever.
  MpiWork(const char* what, std::string group, double timeout_s)
      : what_(what), group_(std::move(group)), timeout_s_(timeout_s) {}
  ~MpiWork() override {
    try {
      wait();  // never leave a buffer in flight; a missed deadline still aborts the job
    } catch (...) {
    }
  }
  /// Starts one MPI call: `start(&request)` returns its status. @throws CommError when it fails.
  template <class Start>
  void issue(Start&& start) {
    MPI_Request r = MPI_REQUEST_NULL;
    check(start(&r), what_, group_);
    reqs_.push_back(r);
  }
  /// Takes ownership of a committed datatype used by the requests issued so far.
  void adopt(MPI_Datatype t) { types_.push_back(t); }
  /// Keeps the count / displacement arrays of a non-blocking v-collective alive until it
  /// completes (MPI reads them until then). Returns the stored copy's data.
  const int* keep(std::vector<int> v) {
    arrays_.push_back(std::move(v));
    return arrays_.back().data();
  }

  /// Polls every request until all completed or the deadline passed; then the watchdog aborts
  /// the job. Polls with a growing sleep (up to 1 ms) instead of MPI_Waitall's busy loop, which
  /// also leaves the core to the ranks still computing when ranks are oversubscribed.
  void wait() override {
    if (test()) return;
    trace::Span span(what_, "comm_wait");  // only the time this rank was blocked
    span.arg("group", group_);
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0; !test(); ++polls) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_s_ > 0 && waited > timeout_s_) deadline_passed(what_, group_, timeout_s_);
      if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 100))));
    }
  }
  bool test() override {
    if (done_) return true;
    int all = 0;
    statuses_.resize(reqs_.size());
    const int rc = MPI_Testall(checked_int_count(int64_t(reqs_.size()), what_), reqs_.data(), &all, statuses_.data());
    if (rc != MPI_SUCCESS) {
      done_ = true;  // an MPI error leaves the communicator unusable: do not poll it again
      int first = rc;
      if (rc == MPI_ERR_IN_STATUS)
        for (const MPI_Status& s : statuses_)
          if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
            first = s.MPI_ERROR;
            break;
          }
      check(first, what_, group_);
    }
    if (!all) return false;
    done_ = true;
    if (issued_ns_ >= 0) trace::record_async(what_, "collective", issued_ns_, trace::now_ns(), {{"group", group_}});
    for (MPI_Datatype& t : types_) MPI_Type_free(&t);
    types_.clear();
    return true;
  }

 private:
  const char* what_;
  std::string group_;
  double timeout_s_;
  std::vector<MPI_Request> reqs_;
  std::vector<MPI_Status> statuses_;
  std::vector<MPI_Datatype> types_;
  std::deque<std::vector<int>> arrays_;  // stable addresses while requests read them
  bool done_ = false;
  // Tracing: start of the issue-to-first-observed-completion interval (-1: tracing was off).
  int64_t issued_ns_ = trace::enabled() ? trace::now_ns() : -1;
};

/// Element `i` of tensor t (t's dtype), as MPI buffer address.
void* element(const Tensor& t, int64_t i) {
  return static_cast<char*>(t.raw()) + i * int64_t(dtype_size(t.dtype()));
}

/// A datatype of `count` consecutive `elem`s whose extent is `stride` elements, committed and
/// owned by `work`: instance j of it addresses the same chunk of per-rank block j when blocks are
/// `stride` elements apart (MPI-3.1 §4.1.7, MPI_Type_create_resized).
MPI_Datatype block_chunk_type(MpiWork& work, MPI_Datatype elem, int count, int64_t stride, const char* what,
                              const std::string& group) {
  int elem_size = 0;
  check(MPI_Type_size(elem, &elem_size), what, group);
  MPI_Datatype contig = MPI_DATATYPE_NULL, resized = MPI_DATATYPE_NULL;
  check(MPI_Type_contiguous(count, elem, &contig), what, group);
  const int rc = MPI_Type_create_resized(contig, 0, MPI_Aint(stride) * elem_size, &resized);
  MPI_Type_free(&contig);  // the resized type keeps what it needs of it
  check(rc, what, group);
  check(MPI_Type_commit(&resized), what, group);
  work.adopt(resized);
  return resized;
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv, int thread_level) {
  int provided = 0;
  MPI_Init_thread(argc, argv, thread_level, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, len);
  // After MPI_Init, which installed Open MPI's own handler: ours also names the caller of a
  // null function pointer (see crash_report.hpp).
  install_crash_report("[rank " + std::to_string(rank_) + " " + host_ + "] ");
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
  // MPI_Abort asks the launcher to end every rank; when this node's link is cut it may wait for
  // the launcher forever. A rank must not hang: it leaves by itself after a grace period.
  constexpr auto kAbortGrace = std::chrono::seconds(10);
  std::thread([status, kAbortGrace] {
    std::this_thread::sleep_for(kAbortGrace);
    std::fflush(stderr);
    _exit(status);
  }).detach();
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
  const MPI_Datatype type = mpi_type(t);
  const MPI_Op mop = reduce_op(op, t.dtype(), name_);
  auto work = std::make_unique<MpiWork>("all_reduce", describe(), timeout_s_);
  for (const MpiChunk& c : plan_mpi_chunks(t.numel(), mpi_max_count()))
    work->issue([&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, element(t, c.offset), c.count, type, mop, comm_, r);
    });
  count(CollectiveKind::kAllReduce, int64_t(2 * t.nbytes() * (size_ - 1) / size_));
  return work;
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  if (in.numel() != out.numel() * size_) throw std::invalid_argument("reduce_scatter: in must be size × out");
  if (in.dtype() != out.dtype()) throw std::invalid_argument("reduce_scatter: in and out must have one dtype");
  const MPI_Datatype type = mpi_type(in);
  const MPI_Op mop = reduce_op(op, in.dtype(), name_);
  const int64_t n = out.numel();
  auto work = std::make_unique<MpiWork>("reduce_scatter", describe(), timeout_s_);
  if (n <= per_rank_max_count(mpi_max_count(), size_)) {
    work->issue([&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in.raw(), out.raw(), int(n), type, mop, comm_, r);
    });
  } else {
    // Chunk k of block j is reduced onto rank j by its own MPI_Ireduce: chunks of the blocks are
    // strided in `in`, and Open MPI's non-blocking reduce-scatter of a strided datatype would
    // allocate a temporary of the whole input per chunk (libnbc reduces ranks × count elements
    // into one buffer, then scatters). Each rank still sends every element of `in` once.
    for (const MpiChunk& c : plan_mpi_chunks(n, mpi_max_count()))
      for (int root = 0; root < size_; ++root)
        work->issue([&](MPI_Request* r) {
          return MPI_Ireduce(element(in, root * n + c.offset), root == rank_ ? element(out, c.offset) : nullptr,
                             c.count, type, mop, root, comm_, r);
        });
  }
  count(CollectiveKind::kReduceScatter, int64_t(in.nbytes() * (size_ - 1) / size_));
  return work;
}

std::unique_ptr<Work> MpiCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  if (out.numel() != in.numel() * size_) throw std::invalid_argument("all_gather: out must be size × in");
  if (in.dtype() != out.dtype()) throw std::invalid_argument("all_gather: in and out must have one dtype");
  const MPI_Datatype type = mpi_type(in);
  const int64_t n = in.numel();
  auto work = std::make_unique<MpiWork>("all_gather", describe(), timeout_s_);
  // Chunk k of every rank's block lands in one call, through a receive type whose instances are
  // n elements apart (one per rank's block of out).
  for (const MpiChunk& c : plan_mpi_chunks(n, per_rank_max_count(mpi_max_count(), size_))) {
    const bool whole = c.count == n;
    const MPI_Datatype recv = whole ? type : block_chunk_type(*work, type, c.count, n, "all_gather", describe());
    work->issue([&](MPI_Request* r) {
      return MPI_Iallgather(element(in, c.offset), c.count, type, element(out, c.offset), whole ? c.count : 1, recv,
                            comm_, r);
    });
  }
  count(CollectiveKind::kAllGather, int64_t(out.nbytes() * (size_ - 1) / size_));
  return work;
}

std::unique_ptr<Work> MpiCommunicator::broadcast(const Tensor& t, int root) {
  const MPI_Datatype type = mpi_type(t);
  auto work = std::make_unique<MpiWork>("broadcast", describe(), timeout_s_);
  for (const MpiChunk& c : plan_mpi_chunks(t.numel(), mpi_max_count()))
    work->issue([&](MPI_Request* r) { return MPI_Ibcast(element(t, c.offset), c.count, type, root, comm_, r); });
  if (rank_ == root) count(CollectiveKind::kBroadcast, int64_t(t.nbytes()));
  return work;
}

std::unique_ptr<Work> MpiCommunicator::send(const Tensor& t, int peer, int tag) {
  const MPI_Datatype type = mpi_type(t);
  auto work = std::make_unique<MpiWork>("send", describe(), timeout_s_);
  // MPI's non-overtaking rule (MPI-3.1 §3.5) delivers the chunks in order into the receiver's
  // chunks, which recv plans the same way.
  for (const MpiChunk& c : plan_mpi_chunks(t.numel(), mpi_max_count()))
    work->issue([&](MPI_Request* r) { return MPI_Isend(element(t, c.offset), c.count, type, peer, tag, comm_, r); });
  count(CollectiveKind::kSendRecv, int64_t(t.nbytes()));
  return work;
}

std::unique_ptr<Work> MpiCommunicator::recv(const Tensor& t, int peer, int tag) {
  const MPI_Datatype type = mpi_type(t);
  auto work = std::make_unique<MpiWork>("recv", describe(), timeout_s_);
  for (const MpiChunk& c : plan_mpi_chunks(t.numel(), mpi_max_count()))
    work->issue([&](MPI_Request* r) { return MPI_Irecv(element(t, c.offset), c.count, type, peer, tag, comm_, r); });
  return work;
}

std::unique_ptr<Work> MpiCommunicator::all_to_all(const Tensor& in, const Tensor& out) {
  if (in.numel() != out.numel() || in.numel() % size_) throw std::invalid_argument("all_to_all: sizes");
  if (in.dtype() != out.dtype()) throw std::invalid_argument("all_to_all: in and out must have one dtype");
  const MPI_Datatype type = mpi_type(in);
  const int64_t n = in.numel() / size_;
  auto work = std::make_unique<MpiWork>("all_to_all", describe(), timeout_s_);
  // Chunk k of every block, sent and received through one type whose instances are n apart.
  for (const MpiChunk& c : plan_mpi_chunks(n, per_rank_max_count(mpi_max_count(), size_))) {
    const bool whole = c.count == n;
    const MPI_Datatype block = whole ? type : block_chunk_type(*work, type, c.count, n, "all_to_all", describe());
    const int k = whole ? c.count : 1;
    work->issue([&](MPI_Request* r) {
      return MPI_Ialltoall(element(in, c.offset), k, block, element(out, c.offset), k, block, comm_, r);
    });
  }
  count(CollectiveKind::kAllToAll, int64_t(in.nbytes() * (size_ - 1) / size_));
  return work;
}

std::unique_ptr<Work> MpiCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows,
                                                    const Tensor& out, const std::vector<int64_t>& recv_rows) {
  const int64_t row = all_to_all_v_row_elems(in, send_rows, out, recv_rows, size_);
  auto work = std::make_unique<MpiWork>("all_to_all_v", describe(), timeout_s_);
  // Counts and displacements in rows of one contiguous datatype, so they stay small integers
  // whatever the row width (a row of D elements is one unit).
  MPI_Datatype row_type = MPI_DATATYPE_NULL;
  check(MPI_Type_contiguous(checked_int_count(std::max<int64_t>(row, 1), "all_to_all_v row"), mpi_type(in), &row_type),
        "all_to_all_v", describe());
  check(MPI_Type_commit(&row_type), "all_to_all_v", describe());
  work->adopt(row_type);
  const size_t ranks = static_cast<size_t>(size_);
  std::vector<int> sc(ranks), sd(ranks), rc(ranks), rd(ranks);
  int64_t so = 0, ro = 0, bytes = 0;
  for (int i = 0; i < size_; ++i) {
    sc[size_t(i)] = checked_int_count(send_rows[size_t(i)], "all_to_all_v send rows");
    rc[size_t(i)] = checked_int_count(recv_rows[size_t(i)], "all_to_all_v receive rows");
    sd[size_t(i)] = checked_int_count(so, "all_to_all_v send displacement");
    rd[size_t(i)] = checked_int_count(ro, "all_to_all_v receive displacement");
    so += send_rows[size_t(i)];
    ro += recv_rows[size_t(i)];
    if (i != rank_) bytes += send_rows[size_t(i)] * row * int64_t(dtype_size(in.dtype()));
  }
  const int *scp = work->keep(std::move(sc)), *sdp = work->keep(std::move(sd));
  const int *rcp = work->keep(std::move(rc)), *rdp = work->keep(std::move(rd));
  work->issue([&](MPI_Request* r) {
    return MPI_Ialltoallv(in.raw(), scp, sdp, row_type, out.raw(), rcp, rdp, row_type, comm_, r);
  });
  count(CollectiveKind::kAllToAll, bytes);
  return work;
}

void MpiCommunicator::barrier() {
  MpiWork work("barrier", describe(), timeout_s_);
  work.issue([&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  work.wait();
}

void MpiCommunicator::all_reduce_host(double* values, int n, ReduceOp op) {
  if (n < 0) throw std::invalid_argument("all_reduce_host: negative count " + std::to_string(n));
  MpiWork work("all_reduce (host scalars)", describe(), timeout_s_);
  for (const MpiChunk& c : plan_mpi_chunks(n, mpi_max_count()))
    work.issue([&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, values + c.offset, c.count, MPI_DOUBLE, mpi_op(op), comm_, r);
    });
  work.wait();
}

std::string MpiCommunicator::describe() const {
  // An unsplit communicator (world) is the one group of its dimension: group 0, so that every
  // watchdog line names a group in the same format.
  return "dimension '" + name_ + "' group " + std::to_string(group_ >= 0 ? group_ : 0) + " (" +
         std::to_string(size_) + " ranks, this rank " + std::to_string(rank_) + ")";
}

}  // namespace meshtrain
