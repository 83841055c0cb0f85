#pragma once
/// @file Communicator: the collectives of one group of ranks (one mesh dimension or derived
/// group), each asynchronous, returning a Work handle (DESIGN.md, Core interfaces).
/// MpiCommunicator implements it with non-blocking MPI; NcclCommunicator (CUDA issue) with
/// stream-ordered NCCL. Tensors are contiguous f32 unless stated; sizes in elements.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace meshtrain {

/// Checks all_to_all_v's arguments for a group of `size` ranks and returns the elements per row.
/// @throws std::invalid_argument naming the rule broken.
int64_t all_to_all_v_row_elems(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                               const std::vector<int64_t>& recv_rows, int size);

enum class ReduceOp { kSum, kMax, kMin };

/// Handle of one in-flight collective.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the collective completed. @throws CommError on failure.
  virtual void wait() = 0;
  /// Non-blocking completion check; also drives MPI progress. @throws CommError.
  virtual bool test() = 0;
};

/// Collectives on which byte counters are kept (bytes this rank sends, for perf/comm_volume).
enum class CollectiveKind : int { kAllReduce = 0, kReduceScatter, kAllGather, kBroadcast, kSendRecv, kAllToAll, kCount };
/// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "all_to_all" (the
/// keys of metrics.jsonl's comm_bytes). Throws nothing.
inline const char* collective_name(CollectiveKind k) {
  static const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "all_to_all"};
  return names[int(k)];
}

/// One transfer of a batch posted by Communicator::send_recv_batch: send `tensor` to `peer`
/// (group rank), or receive into it from `peer`; `tag` as in send() / recv().
struct P2POp {
  bool send = true;
  Tensor tensor;
  int peer = 0;
  int tag = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Name of the dimension or group ("dp_replicate", "world", ...), used in error messages.
  virtual const std::string& name() const = 0;

  /// In-place all-reduce of t over the group.
  virtual std::unique_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) = 0;
  /// out [n] = the reduction over ranks of block `rank` of in [size · n].
  virtual std::unique_ptr<Work> reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  /// out [size · n] = the concatenation of every rank's in [n], in rank order.
  virtual std::unique_ptr<Work> all_gather(const Tensor& in, const Tensor& out) = 0;
  /// t on every rank := t on `root`.
  virtual std::unique_ptr<Work> broadcast(const Tensor& t, int root) = 0;
  virtual std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> recv(const Tensor& t, int peer, int tag) = 0;
  /// Posts the sends and receives of `ops` together and returns one Work per op, in order.
  /// A backend whose transfers wait for each other unless fused overrides it: NCCL issues the
  /// batch as one group on the communication stream, so all its transfers progress at once
  /// (pipeline schedules rely on that; parallel/pipeline/stream_order.hpp). This default posts
  /// each through send() / recv(), which over MPI are independent non-blocking transfers.
  /// @throws as send() / recv(); ops posted before a failing one stay in flight in the Works
  /// already created, which are destroyed (waited for) before the exception leaves.
  virtual std::vector<std::unique_ptr<Work>> send_recv_batch(const std::vector<P2POp>& ops) {
    std::vector<std::unique_ptr<Work>> works;
    works.reserve(ops.size());
    for (const P2POp& op : ops)
      works.push_back(op.send ? send(op.tensor, op.peer, op.tag) : recv(op.tensor, op.peer, op.tag));
    return works;
  }
  /// in, out [size · n]: block j of `in` goes to rank j, block i of `out` comes from rank i.
  virtual std::unique_ptr<Work> all_to_all(const Tensor& in, const Tensor& out) = 0;
  /// Uneven all-to-all over rows (the token exchange of expert parallelism): a row is one
  /// index of dim 0 (a [R, D] tensor's row is D elements; a 1-D tensor's, one element). `in`
  /// [Σ send_rows, …] is cut in rank order into blocks of send_rows[j] rows, block j going to
  /// rank j; `out` [Σ recv_rows, …] receives rank i's block at offset Σ_{i' < i} recv_rows[i'].
  /// recv_rows[i] must be what rank i sends here (exchange the counts first, e.g. with
  /// all_to_all); any count may be 0. Bytes counted: the rows sent to other ranks.
  /// @throws std::invalid_argument on count vectors of the wrong length, negative counts, row
  /// totals that do not match the tensors, or mismatched dtypes or row widths; CommError.
  virtual std::unique_ptr<Work> all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                                             const std::vector<int64_t>& recv_rows) = 0;
  virtual void barrier() = 0;

  /// Blocking fp64 all-reduce of a few host scalars (loss sums, token counts, norms).
  virtual void all_reduce_host(double* values, int n, ReduceOp op) = 0;

  /// Bytes this rank has sent per collective kind since construction, counted as the standard
  /// ring-algorithm volume: all-reduce 2·S·(N−1)/N, reduce-scatter and all-gather S·(N−1)/N,
  /// broadcast S (root) — Patarasuk & Yuan 2009's bandwidth-optimal ring volumes (bytes).
  const std::array<int64_t, int(CollectiveKind::kCount)>& bytes_sent() const { return bytes_; }

 protected:
  void count(CollectiveKind k, int64_t bytes) { bytes_[int(k)] += bytes; }
  std::array<int64_t, int(CollectiveKind::kCount)> bytes_{};
};

}  // namespace meshtrain
