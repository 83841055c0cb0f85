// CPU Float8 emulation of a GEMM operand: the cast of tensor/float8.hpp on host memory.
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "device/cpu/cpu_device.hpp"
#include "device/cuda/float8_math.hpp"
#include "tensor/bf16.hpp"

namespace meshtrain {

namespace {
void check_operand(const char* k, const Tensor& src, const Tensor& dst) {
  if (src.dtype() != DType::kF32 || dst.dtype() != DType::kF32 || src.ndim() != 2 || src.shape() != dst.shape())
    throw std::invalid_argument(std::string(k) + ": needs f32 src and dst of one 2-D shape; got " +
                                dtype_name(src.dtype()) + " " + shape_str(src.shape()) + " and " +
                                dtype_name(dst.dtype()) + " " + shape_str(dst.shape()));
}
void check_amax(const char* k, const Tensor& src, Float8Scaling scaling, const Tensor& amax) {
  const int64_t groups = float8_group_count(src.dim(0), src.dim(1), scaling);
  if (amax.dtype() != DType::kF32 || amax.numel() != groups)
    throw std::invalid_argument(std::string(k) + ": amax must be f32 [" + std::to_string(groups) + "] for " +
                                shape_str(src.shape()) + ", got " + dtype_name(amax.dtype()) + " " +
                                shape_str(amax.shape()));
}
// The byte casts' checks; returns the scale of amax[0].
float byte_cast_scale(const char* k, const Tensor& hp, const Tensor& amax, const Tensor& bytes, Float8Format format,
                      bool power_of_two) {
  if (hp.dtype() == DType::kI32 || amax.dtype() != DType::kF32 || amax.numel() != 1 ||
      bytes.dtype() != DType::kI32 || bytes.numel() * 4 < hp.numel())
    throw std::invalid_argument(std::string(k) + ": needs an f32 / bf16 tensor of n elements, amax f32 [1] and i32 "
                                "bytes of >= n/4 elements; got " + dtype_name(hp.dtype()) + " " +
                                shape_str(hp.shape()) + ", amax " + dtype_name(amax.dtype()) + " " +
                                shape_str(amax.shape()) + ", bytes " + dtype_name(bytes.dtype()) + " " +
                                shape_str(bytes.shape()));
  return float8_scale(amax.f32()[0], format, power_of_two);
}
f8::Format math_format(Float8Format f) { return f == Float8Format::kE4M3 ? f8::e4m3() : f8::e5m2(); }
}  // namespace

void CpuDevice::float8_quantize_bytes(const Tensor& src, Float8Format format, bool power_of_two, const Tensor& amax,
                                      const Tensor& bytes) {
  const float s = byte_cast_scale("float8_quantize_bytes", src, amax, bytes, format, power_of_two);
  const f8::Format f = math_format(format);
  auto* out = static_cast<uint8_t*>(bytes.raw());
  const int64_t n = src.numel();
  // f8::round is tensor/float8's float8_round operation for operation (test_float8 checks it).
  if (src.dtype() == DType::kF32)
    for (int64_t i = 0; i < n; ++i) out[i] = f8::encode(f8::round(src.f32()[i] * s, f), f);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f8::encode(f8::round(float_from_bf16(src.bf16()[i]) * s, f), f);
}

void CpuDevice::float8_dequantize_bytes(const Tensor& bytes, Float8Format format, bool power_of_two,
                                        const Tensor& amax, const Tensor& dst) {
  const float s = byte_cast_scale("float8_dequantize_bytes", dst, amax, bytes, format, power_of_two);
  const f8::Format f = math_format(format);
  const auto* in = static_cast<const uint8_t*>(bytes.raw());
  const int64_t n = dst.numel();
  // decode(encode(q)) == q, so this is float8_quantize_with_amax's float8_round(x · s) / s.
  if (dst.dtype() == DType::kF32)
    for (int64_t i = 0; i < n; ++i) dst.f32()[i] = f8::decode(in[i], f) / s;
  else
    for (int64_t i = 0; i < n; ++i) dst.bf16()[i] = bf16_from_float(f8::decode(in[i], f) / s);
}

void CpuDevice::float8_cast(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& dst) {
  check_operand("float8_cast", src, dst);
  float8_cast_operand(src.f32(), src.dim(0), src.dim(1), cast, power_of_two, dst.f32());
}

void CpuDevice::float8_amax(const Tensor& src, Float8Scaling scaling, const Tensor& amax) {
  check_operand("float8_amax", src, src);
  check_amax("float8_amax", src, scaling, amax);
  float8_group_amax(src.f32(), src.dim(0), src.dim(1), scaling, amax.f32());
}

void CpuDevice::float8_cast_with_amax(const Tensor& src, const Float8Cast& cast, bool power_of_two,
                                      const Tensor& amax, const Tensor& dst) {
  check_operand("float8_cast_with_amax", src, dst);
  if (!cast.quantize) throw std::invalid_argument("float8_cast_with_amax: the cast does not quantize");
  check_amax("float8_cast_with_amax", src, cast.scaling, amax);
  float8_quantize_with_amax(src.f32(), src.dim(0), src.dim(1), cast.format, cast.scaling, power_of_two, amax.f32(),
                            dst.f32());
}

}  // namespace meshtrain
