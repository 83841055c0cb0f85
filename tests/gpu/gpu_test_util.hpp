#pragma once
/// @file Helpers of the CUDA kernel tests: random inputs, poisoned outputs, CPU-vs-GPU
/// comparison. Every test compares CudaDevice against CpuDevice (the fp32 reference) on the
/// same inputs: fp32 paths to ≤ 1e-5 and bf16 paths to ≤ 1e-2, measured as
/// max_i |gpu_i − cpu_i| / max_i |cpu_i| (normwise, so tiny elements do not dominate).
/// Outputs are poisoned with NaN before each GPU run so a kernel that leaves elements
/// unwritten fails.
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "tensor/bf16.hpp"
#include "tensor_values.hpp"

namespace meshtrain::gputest {

/// The process-wide devices of one test binary (created by gpu_test_main).
struct Devices {
  std::unique_ptr<Device> cpu, gpu;
};
inline Devices& devices() {
  static Devices d;
  return d;
}
inline Device& cpu() { return *devices().cpu; }
inline Device& gpu() { return *devices().gpu; }

/// Host values of t (f32, bf16 widened, i32 converted) as floats.
inline std::vector<float> host_values(Device& dev, const Tensor& t) { return testing::tensor_values(dev, t); }

/// Uploads float values into t (rounded to bf16 when t is bf16).
inline void set_values(Device& dev, const Tensor& t, const std::vector<float>& v) {
  testing::set_tensor_values(dev, t, v);
}

/// n values ~ N(0, std²) from `seed`, rounded to bf16 when `round_bf16` (so the CPU reference
/// sees exactly the GPU's inputs).
inline std::vector<float> randn(int64_t n, uint64_t seed, float std = 1.0f, bool round_bf16 = false) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(static_cast<size_t>(n));  // not size_t(n): that declares a function
  for (auto& x : v) {
    x = d(g);
    if (round_bf16) x = float_from_bf16(bf16_from_float(x));
  }
  return v;
}

/// Fills a GPU tensor with 0xFF bytes (NaN in f32 and bf16).
inline void poison(const Tensor& t) {
  std::vector<unsigned char> nan(t.nbytes(), 0xFF);
  gpu().upload(t, nan.data(), nan.size());
}

/// A pair of tensors holding the same values: `c` f32 on the CPU, `g` of dtype `dt` on the GPU.
struct Pair {
  Tensor c, g;
};
inline Pair make_pair(const Shape& s, DType dt, const std::vector<float>& v) {
  Pair p{cpu().empty(s, DType::kF32, MemCategory::kTemporaries), gpu().empty(s, dt, MemCategory::kTemporaries)};
  set_values(cpu(), p.c, v);
  set_values(gpu(), p.g, v);
  return p;
}
inline Pair random_pair(const Shape& s, DType dt, uint64_t seed, float std = 1.0f) {
  return make_pair(s, dt, randn(shape_numel(s), seed, std, dt == DType::kBF16));
}
/// Output pair: CPU zero-filled, GPU filled with NaN (0xFFFF… bytes) so unwritten elements show.
inline Pair output_pair(const Shape& s, DType dt) {
  Pair p{cpu().zeros(s, DType::kF32, MemCategory::kTemporaries), gpu().empty(s, dt, MemCategory::kTemporaries)};
  poison(p.g);
  return p;
}
/// Integer ids in [lo, hi) on both devices (i32).
inline Pair id_pair(int64_t n, int lo, int hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  Pair p{cpu().empty({n}, DType::kI32, MemCategory::kTemporaries), gpu().empty({n}, DType::kI32, MemCategory::kTemporaries)};
  cpu().upload(p.c, v.data(), v.size() * 4);
  gpu().upload(p.g, v.data(), v.size() * 4);
  return p;
}

/// Normwise relative error max|g − c| / max|c|; a NaN anywhere in g gives +inf.
inline double rel_error(const std::vector<float>& g, const std::vector<float>& c) {
  double num = 0, den = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (!std::isfinite(g[i]) && std::isfinite(c[i])) return INFINITY;
    num = std::max(num, double(std::fabs(g[i] - c[i])));
    den = std::max(den, double(std::fabs(c[i])));
  }
  return den > 0 ? num / den : num;
}
/// Tolerance of a path in `dt`: 1e-5 (f32), 1e-2 (bf16).
inline double tol(DType dt) { return dt == DType::kBF16 ? 1e-2 : 1e-5; }

/// Checks the GPU tensor of `p` against its CPU tensor; reports `what` and the error.
inline void expect_close(const Pair& p, DType dt, const std::string& what, double tolerance = -1) {
  const double e = rel_error(host_values(gpu(), p.g), host_values(cpu(), p.c));
  const double t = tolerance > 0 ? tolerance : tol(dt);
  BOOST_TEST_MESSAGE(what << " [" << dtype_name(dt) << "]: rel err " << e);
  BOOST_CHECK_MESSAGE(e <= t, what << " [" << dtype_name(dt) << "]: rel err " << e << " > " << t);
}

/// Whether two GPU tensors hold bitwise-identical bytes (repeat runs of deterministic kernels).
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  std::vector<unsigned char> ha(a.nbytes()), hb(b.nbytes());
  gpu().download(ha.data(), a, ha.size());
  gpu().download(hb.data(), b, hb.size());
  return ha == hb;
}

/// A new GPU tensor holding a copy of t.
inline Tensor gpu_clone(const Tensor& t) {
  Tensor c = gpu().empty(t.shape(), t.dtype(), MemCategory::kTemporaries);
  gpu().copy(c, t);
  return c;
}

/// main() of a GPU test binary: exits 77 (ctest SKIPPED) without a GPU, else creates the CPU
/// and GPU devices and runs the Boost.Test suites.
inline int gpu_test_main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  devices().cpu = make_device("cpu", 0);
  devices().gpu = make_device("cuda", 0, 0);
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}

}  // namespace meshtrain::gputest
