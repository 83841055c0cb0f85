#include "model/weight_grad_queue.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/layers/primitives.hpp"

namespace meshtrain {

namespace {

// @throws std::invalid_argument "WeightGradQueue::<term>: <param>: <rule>" unless ok.
void require(bool ok, const char* term, const Parameter& w, const std::string& rule) {
  if (!ok) throw std::invalid_argument(std::string("WeightGradQueue::") + term + ": " + w.name + ": " + rule);
}

// "dy [4, 8]"-style operand list for error messages.
std::string shapes(std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  std::string s;
  for (const auto& [name, t] : ts) s += std::string(s.empty() ? "" : ", ") + name + " " + shape_str(t->shape());
  return s;
}

}  // namespace

void WeightGradQueue::linear(const Tensor& dy, const Tensor& x, const Parameter& w) {
  require(dy.defined() && x.defined(), "linear", w, "dy and x must be defined");
  const std::string got = shapes({{"dy", &dy}, {"x", &x}}) + ", weight " + shape_str(w.local_shape);
  require(dy.ndim() == 2 && x.ndim() == 2 && w.local_shape.size() == 2 && dy.dim(0) == x.dim(0) &&
              dy.dim(1) == w.local_shape[0] && x.dim(1) == w.local_shape[1],
          "linear", w, "needs dy [N, out], x [N, in] and weight [out, in]; got " + got);
  terms_.push_back({Kind::kLinear, &w, dy, x, Tensor(), 0, {}});
}

void WeightGradQueue::rmsnorm(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Parameter& w) {
  require(dy.defined() && x.defined() && rstd.defined(), "rmsnorm", w, "dy, x and rstd must be defined");
  const std::string got =
      shapes({{"dy", &dy}, {"x", &x}, {"rstd", &rstd}}) + ", weight " + shape_str(w.local_shape);
  const int64_t d = x.ndim() >= 1 ? x.dim(-1) : 0;
  require(d > 0 && dy.numel() == x.numel() && rstd.numel() == x.numel() / d && w.local_shape == Shape{d},
          "rmsnorm", w, "needs dy, x [N, D], rstd [N] and weight [D]; got " + got);
  terms_.push_back({Kind::kRmsNorm, &w, dy, x, rstd, 0, {}});
}

void WeightGradQueue::grouped_linear(const Tensor& dy, const Tensor& x, std::vector<int64_t> counts,
                                     const Parameter& w) {
  require(dy.defined() && x.defined(), "grouped_linear", w, "dy and x must be defined");
  const std::string got = shapes({{"dy", &dy}, {"x", &x}}) + ", weight " + shape_str(w.local_shape);
  int64_t rows = 0;
  for (int64_t n : counts) rows += n;
  require(dy.ndim() == 2 && x.ndim() == 2 && w.local_shape.size() == 3 && dy.dim(0) == rows && x.dim(0) == rows &&
              int64_t(counts.size()) == w.local_shape[0] && dy.dim(1) == w.local_shape[1] &&
              x.dim(1) == w.local_shape[2],
          "grouped_linear", w, "needs dy [R, P], x [R, Q], weight [G, P, Q] and G counts summing to R; got " + got);
  terms_.push_back({Kind::kGroupedLinear, &w, dy, x, Tensor(), 0, std::move(counts)});
}

void WeightGradQueue::embedding(const Tensor& grad_out, const Tensor& tokens, const Parameter& w,
                                int64_t vocab_start) {
  require(grad_out.defined() && tokens.defined(), "embedding", w, "grad_out and tokens must be defined");
  const std::string got = shapes({{"grad_out", &grad_out}, {"tokens", &tokens}}) + ", weight " +
                          shape_str(w.local_shape);
  require(grad_out.ndim() == 2 && tokens.dtype() == DType::kI32 && tokens.numel() == grad_out.dim(0) &&
              w.local_shape.size() == 2 && w.local_shape[1] == grad_out.dim(1),
          "embedding", w, "needs grad_out [N, D], tokens i32 [N] and weight [V_local, D]; got " + got);
  terms_.push_back({Kind::kEmbedding, &w, grad_out, tokens, Tensor(), vocab_start, {}});
}

void WeightGradQueue::run(Device& dev) {
  for (const Term& t : terms_) {
    const Parameter& w = *t.param;
    if (!w.grad.defined())
      throw std::logic_error("WeightGradQueue::run: " + w.name +
                             " has no gradient bound (under FSDP run the deferred weight gradients while its unit "
                             "is gathered)");
    if (w.grad.shape() != w.local_shape)
      throw std::logic_error("WeightGradQueue::run: " + w.name + " gradient is bound as " +
                             shape_str(w.grad.shape()) + ", not its tp-local shape " + shape_str(w.local_shape));
  }
  for (const Term& t : terms_) {
    const Tensor& grad = t.param->grad;
    switch (t.kind) {
      case Kind::kLinear: linear_weight_grad(dev, t.a, t.b, *t.param); break;
      case Kind::kRmsNorm: dev.rmsnorm_backward_weight(t.a, t.b, t.c, grad); break;
      case Kind::kEmbedding: dev.embedding_backward(t.a, t.b, grad, t.vocab_start); break;
      case Kind::kGroupedLinear:
        dev.grouped_matmul(GroupedGemm::kBackwardWeight, t.a, t.b, grad, Tensor(), t.counts);
        break;
    }
  }
  terms_.clear();
}

int64_t WeightGradQueue::bytes_held() const {
  // Union of the byte ranges viewed: views of one buffer (x shared by wq, wk, wv; reshapes)
  // count once.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const Term& t : terms_)
    for (const Tensor* x : {&t.a, &t.b, &t.c})
      if (x->defined() && x->nbytes() > 0) {
        const auto begin = reinterpret_cast<uintptr_t>(x->raw());
        ranges.emplace_back(begin, begin + x->nbytes());
      }
  std::sort(ranges.begin(), ranges.end());
  int64_t total = 0;
  uintptr_t covered = 0;  // end of the union so far
  for (const auto& [begin, end] : ranges) {
    const uintptr_t from = std::max(begin, covered);
    if (end > from) total += int64_t(end - from);
    covered = std::max(covered, end);
  }
  return total;
}

}  // namespace meshtrain
