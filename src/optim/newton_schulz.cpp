#include "optim/newton_schulz.hpp"

#include <cmath>
#include <stdexcept>
#include <utility>

namespace meshtrain {

void newton_schulz_orthogonalize(Device& dev, const Tensor& g, int steps, NewtonSchulzCoefficients coef) {
  if (g.shape().size() != 2 || g.dtype() != DType::kF32)
    throw std::invalid_argument("newton_schulz_orthogonalize: needs a 2-D f32 matrix, got " + shape_str(g.shape()));
  if (steps < 0) throw std::invalid_argument("newton_schulz_orthogonalize: steps must be >= 0");
  const int64_t m = g.shape()[0], n = g.shape()[1];
  dev.scale_to_unit_norm(g, 1e-7);  // on CUDA without a host synchronization per matrix
  if (steps == 0 || m == 0 || n == 0) return;
  // A tall matrix iterates on Xᵀ: A = XᵀX [n, n] and the update X·B (B is symmetric).
  const bool tall = m > n;
  const int64_t k = tall ? n : m;
  Tensor a = dev.empty({k, k}, DType::kF32, MemCategory::kTemporaries);
  Tensor b = dev.empty({k, k}, DType::kF32, MemCategory::kTemporaries);
  Tensor x = g, y = dev.empty({m, n}, DType::kF32, MemCategory::kTemporaries);
  for (int i = 0; i < steps; ++i) {
    if (tall) dev.matmul(x, true, x, false, a, 1.0f, 0.0f);
    else dev.matmul(x, false, x, true, a, 1.0f, 0.0f);
    dev.copy(b, a);
    dev.matmul(a, false, a, false, b, coef.c, coef.b);  // B = b·A + c·A²
    dev.copy(y, x);
    if (tall) dev.matmul(x, false, b, false, y, 1.0f, coef.a);  // Y = a·X + X·B
    else dev.matmul(b, false, x, false, y, 1.0f, coef.a);       // Y = a·X + B·X
    std::swap(x, y);
  }
  if (steps % 2) dev.copy(g, x);  // after an odd number of swaps the result is in the temporary
}

double newton_schulz_flops(int64_t m, int64_t n, int steps) {
  const double k = double(std::min(m, n)), l = double(std::max(m, n));
  return double(steps) * (4.0 * k * k * l + 2.0 * k * k * k);
}

}  // namespace meshtrain
