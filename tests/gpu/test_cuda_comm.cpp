// Communicators on CudaDevice tensors, run under mpirun with 2 ranks sharing ONE GPU:
//  - StagedCommunicator (download → MPI → upload) over the world: every collective in f32, bf16
//    and i32 against values computed on the host, and its ordering against the compute stream;
//  - NcclCommunicator on a one-rank NCCL communicator per rank (NCCL 2.28 cannot put two ranks
//    of one communicator on one GPU): the stream-ordered path, Work semantics and the
//    watchdog's error-free path.
// Every rank exits 77 (SKIPPED) before any MPI work when no GPU is visible; ranks on one node see
// the same GPUs, so they agree.
#include "gpu_test_util.hpp"

#include <chrono>
#include <thread>
#include <vector>

#include "comm/staged_communicator.hpp"
#include "device/cuda/cuda_device.hpp"
#include "mpi/mpi_fixture.hpp"
#ifdef MESHTRAIN_HAVE_NCCL
#include <nccl.h>

#include "comm/nccl/nccl_communicator.hpp"
#endif

using namespace meshtrain;
using namespace meshtrain::gputest;
using meshtrain::testing::MpiFixture;

BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

namespace {

/// A GPU tensor holding `v` (converted to dt: bf16 rounded, i32 truncated).
Tensor on_gpu(DType dt, const std::vector<float>& v) {
  Tensor t = gpu().empty({int64_t(v.size())}, dt, MemCategory::kCommunication);
  if (dt == DType::kI32) {
    std::vector<int32_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = int32_t(v[i]);
    gpu().upload(t, h.data(), t.nbytes());
  } else {
    set_values(gpu(), t, v);
  }
  return t;
}

std::vector<float> of_gpu(const Tensor& t) { return host_values(gpu(), t); }

CudaDevice& cuda_dev() { return dynamic_cast<CudaDevice&>(gpu()); }

/// Every collective of `c` (a communicator over all ranks of the job) on GPU tensors of dtype dt.
/// Values are small integers, exact in every dtype and in any reduction order.
void check_collectives(Communicator& c, DType dt) {
  const int me = c.rank(), n = c.size();
  BOOST_TEST_CONTEXT(c.name() << " " << dtype_name(dt)) {
    Tensor t = on_gpu(dt, {float(me + 1), float(3 * me), 7.0f});
    c.all_reduce(t, ReduceOp::kSum)->wait();
    auto v = of_gpu(t);
    BOOST_TEST(v[0] == float(n * (n + 1) / 2));
    BOOST_TEST(v[1] == float(3 * n * (n - 1) / 2));
    BOOST_TEST(v[2] == float(7 * n));
    Tensor mx = on_gpu(dt, {float(me), float(-me)}), mn = on_gpu(dt, {float(me), float(-me)});
    c.all_reduce(mx, ReduceOp::kMax)->wait();
    c.all_reduce(mn, ReduceOp::kMin)->wait();
    BOOST_TEST(of_gpu(mx)[0] == float(n - 1));
    BOOST_TEST(of_gpu(mx)[1] == 0.0f);
    BOOST_TEST(of_gpu(mn)[0] == 0.0f);
    BOOST_TEST(of_gpu(mn)[1] == float(1 - n));

    std::vector<float> in(size_t(3 * n));
    for (int j = 0; j < 3 * n; ++j) in[size_t(j)] = float(10 * me + j);
    Tensor rin = on_gpu(dt, in), rout = on_gpu(dt, {-1, -1, -1});
    c.reduce_scatter(rin, rout, ReduceOp::kSum)->wait();
    auto rv = of_gpu(rout);
    for (int j = 0; j < 3; ++j) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += float(10 * r + 3 * me + j);
      BOOST_TEST(rv[size_t(j)] == want);
    }

    Tensor gin = on_gpu(dt, {float(me), float(me + 100)});
    Tensor gout = on_gpu(dt, std::vector<float>(size_t(2 * n), -1.0f));
    auto w = c.all_gather(gin, gout);
    while (!w->test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    auto gv = of_gpu(gout);
    for (int r = 0; r < n; ++r) {
      BOOST_TEST(gv[size_t(2 * r)] == float(r));
      BOOST_TEST(gv[size_t(2 * r + 1)] == float(r + 100));
    }

    Tensor b = on_gpu(dt, {float(me + 5), float(2 * me)});
    c.broadcast(b, n - 1)->wait();
    BOOST_TEST(of_gpu(b)[0] == float(n + 4));
    BOOST_TEST(of_gpu(b)[1] == float(2 * (n - 1)));

    std::vector<float> a2a(size_t(2 * n));
    for (int j = 0; j < n; ++j) a2a[size_t(2 * j)] = float(me * 10 + j), a2a[size_t(2 * j + 1)] = float(-j);
    Tensor ain = on_gpu(dt, a2a), aout = on_gpu(dt, std::vector<float>(size_t(2 * n), 0.0f));
    c.all_to_all(ain, aout)->wait();
    auto av = of_gpu(aout);
    for (int i = 0; i < n; ++i) {
      BOOST_TEST(av[size_t(2 * i)] == float(i * 10 + me));
      BOOST_TEST(av[size_t(2 * i + 1)] == float(-me));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(staged_collectives_on_cuda_tensors) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  world.set_timeout(60);  // a failing rank must not leave the other waiting for ctest's timeout
  StagedCommunicator c(world, gpu());
  BOOST_REQUIRE_EQUAL(c.size(), world.size());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) check_collectives(c, dt);

  const int me = c.rank(), n = c.size();
  // send / recv around a ring, receive posted first.
  Tensor s = on_gpu(DType::kF32, {float(me + 1), float(me + 2)}), r = on_gpu(DType::kF32, {0, 0});
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto rw = c.recv(r, prev, 3);
  auto sw = c.send(s, next, 3);
  sw->wait();
  rw->wait();
  BOOST_TEST(of_gpu(r)[0] == float(prev + 1));
  BOOST_TEST(of_gpu(r)[1] == float(prev + 2));

  // bf16 sums round to nearest even: 256 + 1 is a tie and stays 256 (the other ranks add 0).
  Tensor tie = on_gpu(DType::kBF16, {me == 0 ? 256.0f : me == 1 ? 1.0f : 0.0f});
  c.all_reduce(tie, ReduceOp::kSum)->wait();
  BOOST_TEST(of_gpu(tie)[0] == 256.0f);

  // Byte counts: the ring formulas, counted once.
  const int64_t S = 3 * 4;
  BOOST_TEST(c.bytes_sent()[int(CollectiveKind::kSendRecv)] == 8);
  BOOST_TEST(c.bytes_sent()[int(CollectiveKind::kAllReduce)] > 0);
  Tensor fresh = on_gpu(DType::kF32, {1, 2, 3});
  const int64_t before = c.bytes_sent()[int(CollectiveKind::kAllReduce)];
  c.all_reduce(fresh, ReduceOp::kSum)->wait();
  BOOST_TEST(c.bytes_sent()[int(CollectiveKind::kAllReduce)] - before == 2 * S * (n - 1) / n);
}

// The staged download must see kernels queued on the compute stream before the collective, and
// kernels queued after wait() must see the uploaded result.
BOOST_AUTO_TEST_CASE(staged_orders_against_compute_stream) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  world.set_timeout(60);
  StagedCommunicator c(world, gpu());
  const int n = c.size();
  Pair a = random_pair({512, 512}, DType::kF32, 11), b = random_pair({512, 512}, DType::kF32, 12);
  Pair prod = output_pair({512, 512}, DType::kF32);
  cpu().matmul(a.c, false, b.c, false, prod.c, 1.0f, 0.0f);
  gpu().matmul(a.g, false, b.g, false, prod.g, 1.0f, 0.0f);  // queued, not waited for
  auto w = c.all_reduce(prod.g, ReduceOp::kSum);
  w->wait();
  cpu().scale(prod.c, float(n));
  expect_close(prod, DType::kF32, "staged all_reduce of a matmul result queued just before");
  // A kernel after wait(): C2 = prod · I must equal the reduced product.
  std::vector<float> eye(512 * 512, 0.0f);
  for (int i = 0; i < 512; ++i) eye[size_t(i) * 513] = 1.0f;
  Pair id = make_pair({512, 512}, DType::kF32, eye);
  Pair c2 = output_pair({512, 512}, DType::kF32);
  cpu().matmul(prod.c, false, id.c, false, c2.c, 1.0f, 0.0f);
  gpu().matmul(prod.g, false, id.g, false, c2.g, 1.0f, 0.0f);
  expect_close(c2, DType::kF32, "a matmul queued after the staged collective's wait()");
}

#ifdef MESHTRAIN_HAVE_NCCL

namespace {

/// A one-rank non-blocking NCCL communicator on this rank's GPU (its own unique id).
ncclComm_t self_nccl_comm() {
  BOOST_REQUIRE(cudaSetDevice(cuda_dev().ordinal()) == cudaSuccess);
  ncclUniqueId id;
  BOOST_REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg);
  BOOST_REQUIRE(r == ncclSuccess || r == ncclInProgress);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    BOOST_REQUIRE(ncclCommGetAsyncError(comm, &state) == ncclSuccess);
    if (state == ncclSuccess) break;
    BOOST_REQUIRE_MESSAGE(state == ncclInProgress, "NCCL init failed: " << ncclGetErrorString(state));
    BOOST_REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return comm;
}

}  // namespace

BOOST_AUTO_TEST_CASE(nccl_communicator_on_one_rank) {
  ncclComm_t comm = self_nccl_comm();
  {
    MpiCommunicator self(MPI_COMM_SELF, "self");
    NcclCommunicator c(comm, cuda_dev(), self, "self");
    c.set_timeout(60);
    BOOST_TEST(c.size() == 1);
    BOOST_TEST(c.rank() == 0);
    BOOST_TEST(c.name() == "self");
    for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) check_collectives(c, dt);

    // Stream order: a matmul queued on the compute stream, then a gather (on the communication
    // stream) of its output into a poisoned buffer, then a download (compute stream).
    Pair a = random_pair({1024, 1024}, DType::kF32, 21), b = random_pair({1024, 1024}, DType::kF32, 22);
    Pair prod = output_pair({1024, 1024}, DType::kF32), gathered = output_pair({1024 * 1024}, DType::kF32);
    cpu().matmul(a.c, false, b.c, false, prod.c, 1.0f, 0.0f);
    cpu().copy(gathered.c, prod.c.reshape({1024 * 1024}));
    gpu().matmul(a.g, false, b.g, false, prod.g, 1.0f, 0.0f);
    c.all_gather(prod.g.reshape({1024 * 1024}), gathered.g)->wait();
    expect_close(gathered, DType::kF32, "NCCL all_gather of a matmul result queued just before");

    // Many collectives in flight at once, waited for only through synchronize(); dropped Works.
    Tensor acc = on_gpu(DType::kF32, {1, 2, 3, 4});
    for (int i = 0; i < 200; ++i) c.all_reduce(acc, ReduceOp::kSum);  // Works dropped at once
    gpu().synchronize();
    BOOST_TEST(of_gpu(acc) == std::vector<float>({1, 2, 3, 4}), boost::test_tools::per_element());

    // Work::test() eventually reports completion; wait() after it is harmless.
    auto w = c.broadcast(acc, 0);
    while (!w->test()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    w->wait();

    // Byte counts with the ring formulas on one rank: nothing leaves the rank except the
    // broadcast root's S.
    const auto& bytes = c.bytes_sent();
    BOOST_TEST(bytes[int(CollectiveKind::kAllReduce)] == 0);
    BOOST_TEST(bytes[int(CollectiveKind::kAllGather)] == 0);
    BOOST_TEST(bytes[int(CollectiveKind::kBroadcast)] > 0);

    // Argument checks throw before anything is queued.
    Tensor small = on_gpu(DType::kF32, {1}), big = on_gpu(DType::kF32, {1, 2});
    BOOST_CHECK_THROW(c.all_gather(big, small), std::invalid_argument);
    BOOST_CHECK_THROW(c.reduce_scatter(big, small, ReduceOp::kSum), std::invalid_argument);
    BOOST_CHECK_THROW(c.all_gather(small, on_gpu(DType::kBF16, {0})), std::invalid_argument);
    BOOST_CHECK_THROW(c.send(small, 1, 0), std::invalid_argument);
    // send / recv to oneself cannot be tested here: they must be in one NCCL group (all_to_all
    // does that), and separate calls on one stream would wait for each other.

    c.barrier();
    double h[2] = {2.0, 3.0};
    c.all_reduce_host(h, 2, ReduceOp::kMax);
    BOOST_TEST(h[0] == 2.0);
    gpu().synchronize();
  }  // the communicator drains its watchdog before the NCCL communicator goes
  BOOST_TEST(ncclCommDestroy(comm) == ncclSuccess);
}

BOOST_AUTO_TEST_CASE(each_communicator_has_its_own_stream) {
  // Two dimensions' communicators: distinct streams, neither the compute stream; a result of
  // one, waited for, feeds the other (ordering rule 1-3 of nccl_communicator.hpp).
  ncclComm_t tp_comm = self_nccl_comm(), fsdp_comm = self_nccl_comm();
  {
    MpiCommunicator self(MPI_COMM_SELF, "self");
    NcclCommunicator tp(tp_comm, cuda_dev(), self, "tp"), fsdp(fsdp_comm, cuda_dev(), self, "fsdp");
    tp.set_timeout(60);
    fsdp.set_timeout(60);
    BOOST_TEST(tp.stream() != fsdp.stream());
    BOOST_TEST(tp.stream() != cuda_dev().compute_stream());
    BOOST_TEST(fsdp.stream() != cuda_dev().comm_stream());
    Pair a = random_pair({512, 512}, DType::kF32, 31), b = random_pair({512, 512}, DType::kF32, 32);
    Pair prod = output_pair({512, 512}, DType::kF32), gathered = output_pair({512 * 512}, DType::kF32);
    cpu().matmul(a.c, false, b.c, false, prod.c, 1.0f, 0.0f);
    cpu().copy(gathered.c, prod.c.reshape({512 * 512}));
    for (int round = 0; round < 20; ++round) {
      gpu().matmul(a.g, false, b.g, false, prod.g, 1.0f, 0.0f);
      tp.all_reduce(prod.g, ReduceOp::kSum)->wait();
      fsdp.all_gather(prod.g.reshape({512 * 512}), gathered.g)->wait();
    }
    expect_close(gathered, DType::kF32, "an all_gather on fsdp of a tp all_reduce's waited result");
    // Many collectives on both, never waited: synchronize() covers every communicator's stream.
    Tensor x = on_gpu(DType::kF32, {1, 2, 3, 4}), y = on_gpu(DType::kF32, {5, 6});
    for (int i = 0; i < 100; ++i) {
      tp.all_reduce(x, ReduceOp::kSum);
      fsdp.all_reduce(y, ReduceOp::kMax);
    }
    gpu().synchronize();
    BOOST_TEST(of_gpu(x) == std::vector<float>({1, 2, 3, 4}), boost::test_tools::per_element());
    BOOST_TEST(of_gpu(y) == std::vector<float>({5, 6}), boost::test_tools::per_element());
  }
  BOOST_TEST(ncclCommDestroy(tp_comm) == ncclSuccess);
  BOOST_TEST(ncclCommDestroy(fsdp_comm) == ncclSuccess);
}

#endif  // MESHTRAIN_HAVE_NCCL

int main(int argc, char** argv) { return meshtrain::gputest::gpu_test_main(argc, argv); }
