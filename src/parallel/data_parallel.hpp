#pragma once
/// @file DataParallel (DDP): gradients all-reduced (sum) over the dp_replicate group in buckets
/// of consecutive units, each launched as soon as the backward of all its units finishes in the
/// last micro-batch (in any order: pipeline stages), so communication overlaps the rest of backward (Li et al. 2020, PyTorch
/// DDP). Summing (not averaging) is right because the loss gradient is already scaled by
/// 1 / global target tokens.
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "model/transformer.hpp"
#include "parallel/grad_sync.hpp"

namespace meshtrain {

class DataParallel final : public GradientSync {
 public:
  /// `model` must hold replicated parameters and gradients. bucket_bytes: target bucket size
  /// (a bucket holds whole units; the last may be larger). reduce_dtype: dtype on the wire
  /// (f32, or bf16: each bucket is cast to bf16, summed in bf16 and widened back on finish()).
  DataParallel(Transformer& model, Communicator& comm, int64_t bucket_bytes = 25 << 20,
               DType reduce_dtype = DType::kF32);
  /// Arms the all-reduces: call with true before the last micro-batch of a step.
  void set_sync(bool sync) { sync_ = sync; }
  void post_backward(size_t unit, int64_t mb) override;
  void pre_forward(size_t, int64_t) override { poll(); }
  void pre_backward(size_t, int64_t) override { poll(); }
  /// Waits for every bucket of this step. @throws CommError.
  void finish();
  /// Number of buckets and their sizes in elements (for tests and reports).
  std::vector<int64_t> bucket_sizes() const;

  void set_micro_batch_role(bool /*first*/, bool last) override { set_sync(last); }
  void begin_evaluation() override { set_sync(false); }
  void finish_gradients() override { finish(); }
  const std::vector<LocalShard>& local_shards() const override { return shards_; }
  /// Local Σ g² over the flat gradient buffer: every rank holds the same reduced gradients.
  double grad_sum_squares(Device& dev, std::vector<double>* each = nullptr) override;
  double take_comm_wait_seconds() override;

 private:
  void poll();  // drives MPI progress of in-flight buckets
  struct Bucket {
    size_t first_unit, last_unit;  // inclusive range of units
    Tensor grads;                  // view of the flat gradient buffer
  };
  struct InFlight {
    Tensor wire, target;  // bf16 reduce: the bf16 copy on the wire and the f32 bucket it widens into
    std::unique_ptr<Work> work;
  };
  Transformer& model_;
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
  std::vector<size_t> reported_;  // per bucket: units whose last-micro-batch gradients are final
  std::vector<InFlight> pending_;
  DType reduce_dtype_;
  std::vector<LocalShard> shards_;
  bool sync_ = false;
  double wait_s_ = 0;
};

}  // namespace meshtrain
