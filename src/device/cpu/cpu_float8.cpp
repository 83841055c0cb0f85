// CPU Float8 emulation of a GEMM operand: the cast of tensor/float8.hpp on host memory.
#include <stdexcept>

#include "device/cpu/cpu_device.hpp"

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
}  // namespace

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
