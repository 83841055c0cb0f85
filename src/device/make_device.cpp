#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "device/cpu/cpu_device.hpp"
#include "device/device.hpp"
#ifdef MESHTRAIN_HAVE_CUDA
#include <cuda_runtime.h>

#include "device/cuda/cuda_device.hpp"
#endif

namespace meshtrain {

int cuda_device_count() {
#ifdef MESHTRAIN_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no GPU: not sticky, clear it
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

void Device::adamw_multi(const std::vector<AdamWSegment>& segments, const AdamWParams& p) {
  AdamWParams q = p;
  for (const AdamWSegment& s : segments) {
    q.weight_decay = s.weight_decay;
    if (s.compute.defined() && (s.compute.dtype() != DType::kBF16 || s.compute.numel() != s.param.numel()))
      throw std::invalid_argument(std::string("adamw_multi: a compute copy must be bfloat16 of the param's ") +
                                  std::to_string(s.param.numel()) + " elements, got " + dtype_name(s.compute.dtype()) +
                                  " of " + std::to_string(s.compute.numel()));
    adamw(s.param, s.grad, s.exp_avg, s.exp_avg_sq, q);
    if (s.compute.defined()) cast(s.compute, s.param);
  }
}

void Device::scale_to_unit_norm(const Tensor& x, double eps) {
  if (x.numel() == 0) return;
  const double norm = std::sqrt(sum_squares(x));
  scale(x, float(1.0 / (norm + eps)));
}

double Device::sum_squares_multi(const std::vector<Tensor>& xs, const std::vector<double>& divisors,
                                 std::vector<double>* each) {
  if (xs.size() != divisors.size())
    throw std::invalid_argument("sum_squares_multi: " + std::to_string(xs.size()) + " tensors but " +
                                std::to_string(divisors.size()) + " divisors");
  if (each) each->assign(xs.size(), 0.0);
  double s = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double term = xs[i].numel() ? sum_squares(xs[i]) / divisors[i] : 0.0;
    if (each) (*each)[i] = term;
    s += term;
  }
  return s;
}

void Device::float8_matmul(const Float8Operand& a, bool trans_a, const Float8Operand& b, bool trans_b,
                           bool power_of_two, bool emulate, const Tensor& c, float alpha, float beta) {
  (void)emulate;
  const auto cast = [&](const Float8Operand& o) {
    Tensor q = empty(o.src.shape(), o.src.dtype(), MemCategory::kTemporaries);
    if (o.amax.defined())
      float8_cast_with_amax(o.src, o.cast, power_of_two, o.amax, q);
    else
      float8_cast(o.src, o.cast, power_of_two, q);
    return q;
  };
  const Tensor qa = cast(a);
  const Tensor qb = cast(b);
  matmul(qa, trans_a, qb, trans_b, c, alpha, beta);
}

void Device::grouped_matmul(GroupedGemm form, const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                            const std::vector<int64_t>& counts) {
  if (w.ndim() != 3 || int64_t(counts.size()) != w.dim(0))
    throw std::invalid_argument("grouped_matmul: weight " + shape_str(w.shape()) + " is not [G, P, Q] for " +
                                std::to_string(counts.size()) + " groups");
  const int64_t p = w.dim(1), q = w.dim(2);
  const bool weight = form == GroupedGemm::kBackwardWeight;
  const Tensor& out = weight ? b : c;  // the second token-major operand
  const int64_t a_cols = form == GroupedGemm::kForward ? q : p;
  const int64_t o_cols = form == GroupedGemm::kBackwardInput || weight ? q : p;
  int64_t rows = 0;
  for (int64_t n : counts) {
    if (n < 0) throw std::invalid_argument("grouped_matmul: negative group count " + std::to_string(n));
    rows += n;
  }
  if (a.ndim() != 2 || out.ndim() != 2 || a.dim(0) != rows || out.dim(0) != rows || a.dim(1) != a_cols ||
      out.dim(1) != o_cols)
    throw std::invalid_argument("grouped_matmul: operands " + shape_str(a.shape()) + " and " +
                                shape_str(out.shape()) + " do not match weight " + shape_str(w.shape()) + " over " +
                                std::to_string(rows) + " rows");
  int64_t first = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t n = counts[g];
    if (n == 0) continue;
    const Tensor wg = w.view({p, q}, int64_t(g) * p * q);
    const Tensor ag = a.view({n, a_cols}, first * a_cols);
    const Tensor og = out.view({n, o_cols}, first * o_cols);
    switch (form) {
      case GroupedGemm::kForward: matmul(ag, false, wg, true, og, 1.0f, 0.0f); break;
      case GroupedGemm::kBackwardInput: matmul(ag, false, wg, false, og, 1.0f, 0.0f); break;
      case GroupedGemm::kBackwardWeight: matmul(ag, true, og, false, wg, 1.0f, 1.0f); break;
    }
    first += n;
  }
}

MatmulDims matmul_dims(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c) {
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2)
    throw std::invalid_argument("matmul needs 2-D tensors, got " + shape_str(a.shape()) + " " + shape_str(b.shape()) +
                                " " + shape_str(c.shape()));
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  if (k != kb || c.dim(0) != m || c.dim(1) != n)
    throw std::invalid_argument("matmul shape mismatch: op(A) " + std::to_string(m) + "x" + std::to_string(k) +
                                ", op(B) " + std::to_string(kb) + "x" + std::to_string(n) + ", C " +
                                shape_str(c.shape()));
  return {m, n, k};
}

bool cuda_build() {
#ifdef MESHTRAIN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Device> make_device(const std::string& kind, int threads, int gpu) {
  if (kind == "cpu") {
    if (threads <= 0) {
      const char* env = std::getenv("OMP_NUM_THREADS");
      threads = env && std::atoi(env) > 0 ? std::atoi(env) : omp_get_num_procs();
    }
    return std::make_unique<CpuDevice>(threads);
  }
  if (kind == "cuda") {
#ifdef MESHTRAIN_HAVE_CUDA
    const int n = cuda_device_count();
    if (n == 0) throw std::runtime_error("device 'cuda': no CUDA GPU is visible to this process (CUDA_VISIBLE_DEVICES, driver)");
    return std::make_unique<CudaDevice>(gpu % n);
#else
    throw std::invalid_argument("device 'cuda': this meshtrain was built without CUDA (MESHTRAIN_CUDA=OFF or no toolkit found)");
#endif
  }
  throw std::invalid_argument("device '" + kind + "' is not implemented (cpu, cuda)");
}

}  // namespace meshtrain
