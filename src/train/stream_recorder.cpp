#include "train/stream_recorder.hpp"

#include <stdexcept>
#include <utility>

namespace meshtrain {

namespace {

/// The handle of one recorded group: wait() appends the compute step that waits for it.
class RecordedWork final : public Work {
 public:
  RecordedWork(std::shared_ptr<StreamProgram> program, size_t group) : program_(std::move(program)), group_(group) {}
  void wait() override {
    if (waited_) return;
    waited_ = true;
    program_->push_back({{}, {group_}, "wait for " + (*program_)[group_].group.front().text});
  }
  bool test() override { return false; }

 private:
  std::shared_ptr<StreamProgram> program_;
  size_t group_;
  bool waited_ = false;
};

[[noreturn]] void not_point_to_point(const char* what) {
  throw std::logic_error(std::string("StreamRecorder records point-to-point exchanges only, not ") + what);
}

}  // namespace

StreamRecorder::StreamRecorder(int rank, int size, std::string name)
    : rank_(rank), size_(size), name_(std::move(name)), program_(std::make_shared<StreamProgram>()) {
  if (rank < 0 || rank >= size)
    throw std::invalid_argument("StreamRecorder: rank " + std::to_string(rank) + " outside a group of " +
                                std::to_string(size));
}

StreamTransfer StreamRecorder::transfer(bool send, const Tensor& t, int peer, int tag) const {
  if (peer < 0 || peer >= size_)
    throw std::invalid_argument(std::string(send ? "send" : "recv") + ": peer " + std::to_string(peer) +
                                " outside the group");
  const std::string message = std::to_string(t.nbytes()) + " bytes, tag " + std::to_string(tag);
  return {send, peer, message, std::string(send ? "send to " : "recv from ") + std::to_string(peer) + " (" + message + ")"};
}

std::unique_ptr<Work> StreamRecorder::record_group(std::vector<StreamTransfer> group) {
  program_->push_back({std::move(group), {}, ""});
  return std::make_unique<RecordedWork>(program_, program_->size() - 1);
}

std::unique_ptr<Work> StreamRecorder::send(const Tensor& t, int peer, int tag) {
  return record_group({transfer(true, t, peer, tag)});
}

std::unique_ptr<Work> StreamRecorder::recv(const Tensor& t, int peer, int tag) {
  return record_group({transfer(false, t, peer, tag)});
}

std::vector<std::unique_ptr<Work>> StreamRecorder::send_recv_batch(const std::vector<P2POp>& ops) {
  std::vector<std::unique_ptr<Work>> works;
  if (ops.empty()) return works;
  std::vector<StreamTransfer> group;
  for (const P2POp& op : ops) group.push_back(transfer(op.send, op.tensor, op.peer, op.tag));
  program_->push_back({std::move(group), {}, ""});
  // Every op's Work waits for the one group, as NcclCommunicator's share its event.
  for (size_t i = 0; i < ops.size(); ++i) works.push_back(std::make_unique<RecordedWork>(program_, program_->size() - 1));
  return works;
}

std::unique_ptr<Work> StreamRecorder::all_reduce(const Tensor&, ReduceOp) { not_point_to_point("all_reduce"); }
std::unique_ptr<Work> StreamRecorder::reduce_scatter(const Tensor&, const Tensor&, ReduceOp) {
  not_point_to_point("reduce_scatter");
}
std::unique_ptr<Work> StreamRecorder::all_gather(const Tensor&, const Tensor&) { not_point_to_point("all_gather"); }
std::unique_ptr<Work> StreamRecorder::broadcast(const Tensor&, int) { not_point_to_point("broadcast"); }
std::unique_ptr<Work> StreamRecorder::all_to_all(const Tensor&, const Tensor&) { not_point_to_point("all_to_all"); }
std::unique_ptr<Work> StreamRecorder::all_to_all_v(const Tensor&, const std::vector<int64_t>&, const Tensor&,
                                                   const std::vector<int64_t>&) {
  not_point_to_point("all_to_all_v");
}
void StreamRecorder::barrier() { not_point_to_point("barrier"); }
void StreamRecorder::all_reduce_host(double*, int, ReduceOp) { not_point_to_point("all_reduce_host"); }

}  // namespace meshtrain
