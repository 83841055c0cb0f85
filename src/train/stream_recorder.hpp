#pragma once
/// @file StreamRecorder: a Communicator that moves no data and records, as one rank's program
/// of the stream-ordered model (parallel/pipeline/stream_order.hpp), the point-to-point calls
/// the code under test makes on it. Running an exchange's real code once per rank on recorders
/// and checking the programs with check_stream_programs() proves that the exchange completes,
/// with every message in its own buffer, on NCCL — without a GPU: the tied embedding's gradient
/// sum (stage_parts.hpp) is checked this way in the tests.
///
/// Recording rules, as NcclCommunicator behaves: send() and recv() are one group each;
/// send_recv_batch() is one group of its ops; Work::wait() is a compute step waiting for the
/// Work's group (the compute stream waits for it); Work::test() answers false (not known to be
/// complete) and records nothing. A message is written "T bytes, tag G": NCCL ignores the tag,
/// but the code means the k-th send and receive of a rank pair to carry the same tag and size,
/// so a mismatch is the wrong buffer.
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/pipeline/stream_order.hpp"

namespace meshtrain {

class StreamRecorder final : public Communicator {
 public:
  /// Rank `rank` of a group of `size` ranks named `name`. @throws std::invalid_argument when
  /// rank is outside [0, size).
  StreamRecorder(int rank, int size, std::string name = "recorded");

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  /// Records one group holding the transfer. @throws std::invalid_argument for a peer outside
  /// the group.
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Work> recv(const Tensor& t, int peer, int tag) override;
  /// Records one group holding every op, in order. @throws std::invalid_argument as send().
  std::vector<std::unique_ptr<Work>> send_recv_batch(const std::vector<P2POp>& ops) override;

  // Collectives are not point-to-point exchanges: each throws std::logic_error naming itself.
  std::unique_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> broadcast(const Tensor& t, int root) override;
  std::unique_ptr<Work> all_to_all(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                                     const std::vector<int64_t>& recv_rows) override;
  void barrier() override;
  void all_reduce_host(double* values, int n, ReduceOp op) override;

  /// The steps recorded so far. Throws nothing.
  const StreamProgram& program() const { return *program_; }

 private:
  StreamTransfer transfer(bool send, const Tensor& t, int peer, int tag) const;
  std::unique_ptr<Work> record_group(std::vector<StreamTransfer> group);

  int rank_, size_;
  std::string name_;
  std::shared_ptr<StreamProgram> program_;  // shared with the Works, which append their waits
};

}  // namespace meshtrain
