#include "tensor/tensor.hpp"

#include <cstring>
#include <stdexcept>

namespace meshtrain {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
  }
  return "?";
}

Storage::Storage(Allocator* alloc, size_t bytes, MemCategory cat)
    : alloc_(alloc), data_(alloc->allocate(bytes, cat)), bytes_(bytes), cat_(cat) {}

Storage::~Storage() { alloc_->deallocate(data_, bytes_, cat_); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor Tensor::empty(Allocator* alloc, const Shape& shape, DType dtype, MemCategory cat) {
  if (shape.size() > 4) throw std::invalid_argument("tensor of more than 4 dimensions: " + shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
  t.storage_ = std::make_shared<Storage>(alloc, bytes, cat);
  return t;
}

float* Tensor::f32() const {
  if (dtype_ != DType::kF32) throw std::logic_error(std::string("f32() on a ") + dtype_name(dtype_) + " tensor");
  return static_cast<float*>(raw());
}

int32_t* Tensor::i32() const {
  if (dtype_ != DType::kI32) throw std::logic_error(std::string("i32() on a ") + dtype_name(dtype_) + " tensor");
  return static_cast<int32_t*>(raw());
}

uint16_t* Tensor::bf16() const {
  if (dtype_ != DType::kBF16) throw std::logic_error(std::string("bf16() on a ") + dtype_name(dtype_) + " tensor");
  return static_cast<uint16_t*>(raw());
}

Tensor Tensor::view(const Shape& shape, int64_t elem_offset) const {
  if (elem_offset < 0 || elem_offset + shape_numel(shape) > numel())
    throw std::out_of_range("view " + shape_str(shape) + " at " + std::to_string(elem_offset) + " exceeds " +
                            shape_str(shape_));
  Tensor t = *this;
  t.offset_ = offset_ + elem_offset;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape_numel(shape) != numel())
    throw std::invalid_argument("reshape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

}  // namespace meshtrain
