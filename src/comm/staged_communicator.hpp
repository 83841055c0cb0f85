#pragma once
/// @file StagedCommunicator: collectives on device tensors over MPI, staged through host memory.
/// NCCL 2.28 cannot host several ranks on one GPU, so multi-rank runs on one GPU (tests of TP
/// and FSDP) and clusters without NCCL move device tensors this way: download the input
/// (Device::download waits for the compute stream, so it sees every kernel queued before),
/// run the non-blocking MPI collective on host buffers, and upload the result into the output
/// when the collective completes (Work::wait or a successful Work::test). Uses only the Device
/// interface, so it also runs over CpuDevice (where it only adds copies) — that is how CI tests
/// it. Sizes stay int64 elements / size_t bytes on the staging side and the MPI transfer is
/// MpiCommunicator's, which chunks counts past MPI's int (mpi_chunking.hpp), so device tensors
/// of 2^31 elements or more are staged whole.
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "device/device.hpp"
#include "tensor/memory.hpp"

namespace meshtrain {

class StagedCommunicator final : public Communicator {
 public:
  /// Collectives of `mpi`'s group on tensors of `dev`. Both must outlive this object and every
  /// Work it returns. Host staging buffers come from a caching allocator of this object (kept
  /// alive by outstanding Works), so steady-state collectives do not allocate.
  StagedCommunicator(MpiCommunicator& mpi, Device& dev);

  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  const std::string& name() const override { return mpi_.name(); }

  // Semantics, sizes, dtypes (f32, bf16, i32; bf16 reductions as MpiCommunicator's user ops),
  // exceptions (std::invalid_argument for sizes and dtypes, CommError from MPI) and the
  // watchdog deadline (the MPI communicator's set_timeout) are those of MpiCommunicator.
  // Each call downloads its device input first, so it waits for the compute stream. The Work
  // uploads the result into the output tensor once, when wait() returns or test() first
  // returns true; a Work destroyed before either still waits for MPI and uploads (as
  // MpiWork's destructor waits), swallowing errors. Bytes are counted once, in this object's
  // bytes_sent(), with MpiCommunicator's ring formulas (the MPI communicator counts the same
  // bytes in its own counters, which DeviceComms does not read when it uses this class).

  std::unique_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> all_gather(const Tensor& in, const Tensor& out) override;
  /// Only `root` downloads; the others receive into their tensor.
  std::unique_ptr<Work> broadcast(const Tensor& t, int root) override;
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override;
  /// Uploads into t when the message arrived.
  std::unique_ptr<Work> recv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Work> all_to_all(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                                     const std::vector<int64_t>& recv_rows) override;
  /// Delegates to the MPI communicator (host barrier; device work is not waited for).
  void barrier() override { mpi_.barrier(); }
  /// Delegates to the MPI communicator.
  void all_reduce_host(double* values, int n, ReduceOp op) override { mpi_.all_reduce_host(values, n, op); }

 private:
  /// A host tensor of t's numel and dtype (flat), from the staging allocator.
  Tensor host_like(const Tensor& t);
  /// Wraps an issued MPI collective: result_host is uploaded into result_dev on completion
  /// (none when result_dev is undefined); input_host is kept alive until then.
  std::unique_ptr<Work> staged(std::unique_ptr<Work> inner, Tensor input_host, Tensor result_host,
                               Tensor result_dev);
  /// Adds what the MPI communicator counted since `before` to this object's counters.
  void absorb(const std::array<int64_t, int(CollectiveKind::kCount)>& before);

  MpiCommunicator& mpi_;
  Device& dev_;
  std::shared_ptr<CachingAllocator> host_;
};

}  // namespace meshtrain
