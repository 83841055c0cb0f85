#include "parallel/composed_sync.hpp"

#include <stdexcept>

namespace meshtrain {

ComposedGradientSync::ComposedGradientSync(std::vector<std::unique_ptr<GradientSync>> parts) : parts_(std::move(parts)) {
  if (parts_.empty()) throw std::invalid_argument("ComposedGradientSync: no parts");
  for (const auto& p : parts_)
    for (const LocalShard& s : p->local_shards()) shards_.push_back(s);
}

void ComposedGradientSync::pre_forward(size_t unit, int64_t mb) {
  for (auto& p : parts_) p->pre_forward(unit, mb);
}
void ComposedGradientSync::post_forward(size_t unit, int64_t mb) {
  for (auto& p : parts_) p->post_forward(unit, mb);
}
void ComposedGradientSync::pre_backward(size_t unit, int64_t mb) {
  for (auto& p : parts_) p->pre_backward(unit, mb);
}
void ComposedGradientSync::post_backward(size_t unit, int64_t mb) {
  for (auto& p : parts_) p->post_backward(unit, mb);
}
void ComposedGradientSync::set_micro_batch_role(bool first, bool last) {
  for (auto& p : parts_) p->set_micro_batch_role(first, last);
}
void ComposedGradientSync::begin_evaluation() {
  for (auto& p : parts_) p->begin_evaluation();
}
void ComposedGradientSync::finish_gradients() {
  for (auto& p : parts_) p->finish_gradients();
}

double ComposedGradientSync::grad_sum_squares(Device& dev, std::vector<double>* each) {
  double total = 0;
  if (each) each->clear();
  std::vector<double> part;
  for (auto& p : parts_) {
    total += p->grad_sum_squares(dev, each ? &part : nullptr);
    if (each) each->insert(each->end(), part.begin(), part.end());
  }
  return total;
}

void ComposedGradientSync::after_optimizer_step() {
  for (auto& p : parts_) p->after_optimizer_step();
}
void ComposedGradientSync::gather_full_parameters() {
  for (auto& p : parts_) p->gather_full_parameters();
}
void ComposedGradientSync::release_full_parameters() {
  for (auto& p : parts_) p->release_full_parameters();
}
bool ComposedGradientSync::forward_is_collective() const {
  for (const auto& p : parts_)
    if (p->forward_is_collective()) return true;
  return false;
}
double ComposedGradientSync::take_comm_wait_seconds() {
  double s = 0;
  for (auto& p : parts_) s += p->take_comm_wait_seconds();
  return s;
}

}  // namespace meshtrain
