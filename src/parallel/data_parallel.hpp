#pragma once
/// @file DataParallel (DDP): gradients all-reduced (sum) over the dp_replicate group in buckets
/// of consecutive units, each launched as soon as the backward of its units finishes in the
/// last micro-batch, so communication overlaps the rest of backward (Li et al. 2020, PyTorch
/// DDP). Summing (not averaging) is right because the loss gradient is already scaled by
/// 1 / global target tokens.
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "graph/executor.hpp"
#include "model/transformer.hpp"

namespace meshtrain {

class DataParallel final : public UnitHooks {
 public:
  /// bucket_bytes: target bucket size (a bucket holds whole units; the last may be larger).
  DataParallel(Transformer& model, Communicator& comm, int64_t bucket_bytes = 25 << 20);
  /// Arms the all-reduces: call with true before the last micro-batch of a step.
  void set_sync(bool sync) { sync_ = sync; }
  void post_backward(size_t unit) override;
  void pre_forward(size_t unit) override { poll(); }
  void pre_backward(size_t unit) override { poll(); }
  /// Waits for every bucket of this step. @throws CommError.
  void finish();
  /// Number of buckets and their sizes in elements (for tests and reports).
  std::vector<int64_t> bucket_sizes() const;

 private:
  void poll();  // drives MPI progress of in-flight buckets
  struct Bucket {
    size_t first_unit, last_unit;  // inclusive range of units
    Tensor grads;                  // view of the flat gradient buffer
  };
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
  std::vector<std::unique_ptr<Work>> pending_;
  bool sync_ = false;
};

}  // namespace meshtrain
