#pragma once
/// @file Tensor: a view (storage, offset, shape up to 4-D, dtype) — no autograd; layers own
/// their backward (DESIGN.md, Core interfaces). Row-major and contiguous unless made by view().
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tensor/memory.hpp"

namespace meshtrain {

/// Element types: f32 (CPU reference, master weights), bf16 (CUDA params/activations),
/// i32 (token ids).
enum class DType : int { kF32 = 0, kBF16, kI32 };
size_t dtype_size(DType d);
const char* dtype_name(DType d);

/// Memory block owned jointly by the tensors viewing it; returned to its allocator on release.
class Storage {
 public:
  Storage(Allocator* alloc, size_t bytes, MemCategory cat);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return cat_; }

 private:
  Allocator* alloc_;
  void* data_;
  size_t bytes_;
  MemCategory cat_;
};

/// Shape of up to 4 dimensions, e.g. [B, T, D].
using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

/// A contiguous row-major view of a Storage.
class Tensor {
 public:
  Tensor() = default;
  /// A new uninitialized tensor of `shape` from `alloc`, accounted under `cat`.
  static Tensor empty(Allocator* alloc, const Shape& shape, DType dtype, MemCategory cat);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  MemCategory category() const { return storage_ ? storage_->category() : MemCategory::kTemporaries; }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_); }
  float* f32() const;     ///< @throws std::logic_error unless dtype is f32
  int32_t* i32() const;   ///< @throws std::logic_error unless dtype is i32
  uint16_t* bf16() const; ///< @throws std::logic_error unless dtype is bf16

  /// A view of `numel(shape)` elements starting `elem_offset` elements into this tensor.
  /// @throws std::out_of_range when the view exceeds the tensor.
  Tensor view(const Shape& shape, int64_t elem_offset = 0) const;
  /// Same elements, another shape of equal numel. @throws std::invalid_argument.
  Tensor reshape(const Shape& shape) const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // elements
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace meshtrain
