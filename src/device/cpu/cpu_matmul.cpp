#include <cblas.h>

#include <stdexcept>

#include "device/cpu/cpu_device.hpp"

namespace meshtrain {

void CpuDevice::matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
                       float beta) {
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2)
    throw std::invalid_argument("matmul needs 2-D tensors, got " + shape_str(a.shape()) + " " + shape_str(b.shape()) +
                                " " + shape_str(c.shape()));
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  if (k != kb || c.dim(0) != m || c.dim(1) != n)
    throw std::invalid_argument("matmul shape mismatch: op(A) " + std::to_string(m) + "x" + std::to_string(k) +
                                ", op(B) " + std::to_string(kb) + "x" + std::to_string(n) + ", C " +
                                shape_str(c.shape()));
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n),
              int(k), alpha, a.f32(), int(a.dim(1)), b.f32(), int(b.dim(1)), beta, c.f32(), int(n));
}

}  // namespace meshtrain
