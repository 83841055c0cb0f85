#pragma once
// Host views of device tensors for tests: values as floats whatever the dtype (f32; bf16 widened;
// i32 converted), and the reverse upload (rounded to bf16 when the tensor is bf16).
#include <cstdint>
#include <vector>

#include "device/device.hpp"
#include "tensor/bf16.hpp"

namespace meshtrain::testing {

/// The elements of t as floats (downloaded from its device).
inline std::vector<float> tensor_values(Device& dev, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF32) {
    dev.download(out.data(), t, t.nbytes());
  } else if (t.dtype() == DType::kBF16) {
    std::vector<uint16_t> h(out.size());
    dev.download(h.data(), t, t.nbytes());
    for (size_t i = 0; i < h.size(); ++i) out[i] = float_from_bf16(h[i]);
  } else {
    std::vector<int32_t> h(out.size());
    dev.download(h.data(), t, t.nbytes());
    for (size_t i = 0; i < h.size(); ++i) out[i] = float(h[i]);
  }
  return out;
}

/// Uploads v into t (v.size() == t.numel()): f32 as is, bf16 rounded to nearest even, i32 truncated.
inline void set_tensor_values(Device& dev, const Tensor& t, const std::vector<float>& v) {
  if (t.dtype() == DType::kF32) {
    dev.upload(t, v.data(), t.nbytes());
  } else if (t.dtype() == DType::kBF16) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = bf16_from_float(v[i]);
    dev.upload(t, h.data(), t.nbytes());
  } else {
    std::vector<int32_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = int32_t(v[i]);
    dev.upload(t, h.data(), t.nbytes());
  }
}

}  // namespace meshtrain::testing
