// CPU Float8 emulation of a GEMM operand: the cast of tensor/float8.hpp on host memory.
#include <stdexcept>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

void CpuDevice::float8_cast(const Tensor& src, const Float8Cast& cast, bool power_of_two, const Tensor& dst) {
  if (src.dtype() != DType::kF32 || dst.dtype() != DType::kF32 || src.ndim() != 2 || src.shape() != dst.shape())
    throw std::invalid_argument("float8_cast: needs f32 src and dst of one 2-D shape; got " +
                                std::string(dtype_name(src.dtype())) + " " + shape_str(src.shape()) + " and " +
                                dtype_name(dst.dtype()) + " " + shape_str(dst.shape()));
  float8_cast_operand(src.f32(), src.dim(0), src.dim(1), cast, power_of_two, dst.f32());
}

}  // namespace meshtrain
