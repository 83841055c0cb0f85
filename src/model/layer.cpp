#include "model/layer.hpp"

#include <stdexcept>

namespace meshtrain {

Tensor SavedTensors::pop() {
  if (stack_.empty()) throw std::logic_error("backward popped more saved tensors than forward pushed");
  Tensor t = stack_.back();
  stack_.pop_back();
  return t;
}

}  // namespace meshtrain
