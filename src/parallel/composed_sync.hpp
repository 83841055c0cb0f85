#pragma once
/// @file ComposedGradientSync: several data-parallel strategies over disjoint parameter sets,
/// driven as one. Expert parallelism needs it: the routed experts are sharded over efsdp (the
/// ranks holding the same experts) while every other parameter is sharded over fsdp, so two
/// ShardedDataParallel instances with complementary ShardedOptions::select run side by side.
#include <memory>
#include <vector>

#include "parallel/grad_sync.hpp"

namespace meshtrain {

class ComposedGradientSync final : public GradientSync {
 public:
  /// `parts` must cover disjoint parameters; every hook and step call goes to each part, in
  /// order (the same on every rank, so their collectives pair up).
  /// @throws std::invalid_argument when `parts` is empty.
  explicit ComposedGradientSync(std::vector<std::unique_ptr<GradientSync>> parts);

  void pre_forward(size_t unit, int64_t mb) override;
  void post_forward(size_t unit, int64_t mb) override;
  void pre_backward(size_t unit, int64_t mb) override;
  void post_backward(size_t unit, int64_t mb) override;
  void set_micro_batch_role(bool first, bool last) override;
  void begin_evaluation() override;
  void finish_gradients() override;
  /// The parts' shards, part after part.
  const std::vector<LocalShard>& local_shards() const override { return shards_; }
  /// Σ over the parts of their (already reduced) sums; `each` in local_shards() order.
  double grad_sum_squares(Device& dev, std::vector<double>* each = nullptr) override;
  void after_optimizer_step() override;
  void gather_full_parameters() override;
  void release_full_parameters() override;
  bool forward_is_collective() const override;
  double take_comm_wait_seconds() override;

 private:
  std::vector<std::unique_ptr<GradientSync>> parts_;
  std::vector<LocalShard> shards_;
};

}  // namespace meshtrain
