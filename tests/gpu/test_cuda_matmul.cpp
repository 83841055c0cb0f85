// CudaDevice core against CpuDevice: cuBLASLt matmul (every transpose combination, odd and large
// shapes, alpha / beta, the three dtype mixes, misaligned views), host transfers, the caching
// allocator's accounting, and the error paths. f32 paths must agree to ≤ 1e-5 and bf16 paths to
// ≤ 1e-2 (normwise, gpu_test_util.hpp).
#include "gpu_test_util.hpp"

#include <cstdint>
#include <cstring>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cuda/cuda_device.hpp"

using namespace meshtrain;
using namespace meshtrain::gputest;

namespace {

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

Shape a_shape(const Case& c) { return c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}; }
Shape b_shape(const Case& c) { return c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}; }

std::string label(const Case& c, float alpha, float beta) {
  return "matmul M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
         " ta=" + std::to_string(c.ta) + " tb=" + std::to_string(c.tb) + " alpha=" + std::to_string(alpha) +
         " beta=" + std::to_string(beta);
}

/// One matmul on both devices and the comparison. ab: dtype of A and B on the GPU; cd: of C.
/// beta = 0 uses a NaN-poisoned GPU output (C must not be read); otherwise C starts random.
void run_case(const Case& c, DType ab, DType cd, float alpha, float beta, uint64_t seed, double tolerance = -1) {
  Pair a = random_pair(a_shape(c), ab, seed);
  Pair b = random_pair(b_shape(c), ab, seed + 1);
  Pair out = beta == 0.0f ? output_pair({c.m, c.n}, cd) : random_pair({c.m, c.n}, cd, seed + 2);
  cpu().matmul(a.c, c.ta, b.c, c.tb, out.c, alpha, beta);
  gpu().matmul(a.g, c.ta, b.g, c.tb, out.g, alpha, beta);
  // A bf16 output is rounded; an f32 output from bf16 inputs is exact products summed in f32.
  const DType path = ab == DType::kBF16 ? DType::kBF16 : DType::kF32;
  expect_close(out, path, label(c, alpha, beta) + " C " + dtype_name(cd), tolerance);
}

/// A pair of tensors of `shape` starting `offset` elements into a larger allocation, so the
/// GPU pointer is only element-aligned (4 bytes for f32, 2 for bf16) when offset is odd.
Pair offset_pair(const Shape& shape, DType dt, int64_t offset, uint64_t seed, bool poisoned) {
  const int64_t n = shape_numel(shape);
  Pair whole = poisoned ? output_pair({n + offset}, dt) : random_pair({n + offset}, dt, seed);
  return Pair{whole.c.view(shape, offset), whole.g.view(shape, offset)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(datasheet_table) {
  BOOST_TEST(datasheet_peak_bf16_flops("NVIDIA H100 80GB HBM3", 9, 0) == 989.4e12);
  BOOST_TEST(datasheet_peak_bf16_flops("NVIDIA H200", 9, 0) == 989.4e12);
  BOOST_TEST(datasheet_peak_bf16_flops("NVIDIA H100 PCIe", 9, 0) == 756e12);
  BOOST_TEST(datasheet_peak_bf16_flops("NVIDIA H100 NVL", 9, 0) == 835e12);
  BOOST_TEST(datasheet_peak_bf16_flops("NVIDIA A100-SXM4-80GB", 8, 0) == 312e12);
  BOOST_TEST(datasheet_peak_bf16_flops("NVIDIA GeForce RTX 4090", 8, 9) == 0.0);
  BOOST_TEST(datasheet_peak_bf16_flops("NVIDIA H100 80GB HBM3", 8, 0) == 0.0);  // name and CC disagree
  auto& dev = dynamic_cast<CudaDevice&>(gpu());
  BOOST_TEST_MESSAGE("GPU " << dev.ordinal() << ": " << dev.gpu_name());
  if (datasheet_peak_bf16_flops(dev.gpu_name(), 9, 0) > 0 || datasheet_peak_bf16_flops(dev.gpu_name(), 8, 0) > 0) {
    bool measured = true;
    BOOST_TEST(dev.peak_flops(&measured) > 1e14);
    BOOST_TEST(!measured);
  }
}

BOOST_AUTO_TEST_CASE(matmul_f32_all_transposes) {
  uint64_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_case({37, 53, 19, ta, tb}, DType::kF32, DType::kF32, 1.0f, 0.0f, seed += 10);
      run_case({37, 53, 19, ta, tb}, DType::kF32, DType::kF32, 0.75f, -1.25f, seed += 10);
      run_case({1, 1, 1, ta, tb}, DType::kF32, DType::kF32, 2.0f, 0.5f, seed += 10);
      run_case({256, 384, 512, ta, tb}, DType::kF32, DType::kF32, 1.0f, 1.0f, seed += 10);
      run_case({130, 7, 1000, ta, tb}, DType::kF32, DType::kF32, -0.5f, 0.0f, seed += 10);
    }
}

BOOST_AUTO_TEST_CASE(matmul_bf16_to_bf16) {
  uint64_t seed = 200;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_case({37, 53, 19, ta, tb}, DType::kBF16, DType::kBF16, 1.0f, 0.0f, seed += 10);
      run_case({37, 53, 19, ta, tb}, DType::kBF16, DType::kBF16, 1.5f, 0.25f, seed += 10);
      run_case({512, 256, 768, ta, tb}, DType::kBF16, DType::kBF16, 1.0f, 0.0f, seed += 10);
    }
}

BOOST_AUTO_TEST_CASE(matmul_bf16_accumulates_into_f32) {
  uint64_t seed = 300;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      // Gradient accumulation: C (f32) += A·B twice, as over two micro-batches.
      const Case c{37, 53, 19, ta, tb};
      Pair a = random_pair(a_shape(c), DType::kBF16, seed += 10);
      Pair b = random_pair(b_shape(c), DType::kBF16, seed += 10);
      Pair out = random_pair({c.m, c.n}, DType::kF32, seed += 10);
      for (int rep = 0; rep < 2; ++rep) {
        cpu().matmul(a.c, ta, b.c, tb, out.c, 1.0f, 1.0f);
        gpu().matmul(a.g, ta, b.g, tb, out.g, 1.0f, 1.0f);
      }
      expect_close(out, DType::kBF16, label(c, 1.0f, 1.0f) + " bf16 x bf16 -> f32, accumulated twice");
      run_case({64, 96, 200, ta, tb}, DType::kBF16, DType::kF32, 0.5f, 0.0f, seed += 10);
      run_case({64, 96, 200, ta, tb}, DType::kBF16, DType::kF32, 1.0f, 1.0f, seed += 10);
    }
}

BOOST_AUTO_TEST_CASE(matmul_large_bf16) {
  run_case({4096, 2048, 2048, false, false}, DType::kBF16, DType::kBF16, 1.0f, 0.0f, 400);
  run_case({4096, 2048, 2048, false, true}, DType::kBF16, DType::kF32, 1.0f, 1.0f, 401);
  run_case({2048, 2048, 4096, true, false}, DType::kBF16, DType::kF32, 1.0f, 0.0f, 402);  // a weight gradient
}

// Mixture-of-Experts: each expert's GEMM has M = its token count (forward, input gradient) or
// K = it (weight gradient), new at every step. The plan cache must ask the heuristic once per
// size bucket, keep at most its capacity of exact problems, and still compute right.
BOOST_AUTO_TEST_CASE(matmul_plan_cache_stays_bounded_over_many_moe_row_counts) {
  auto& dev = dynamic_cast<CudaDevice&>(gpu());
  const CudaDevice::MatmulCacheStats before = dev.matmul_cache_stats();
  std::set<int64_t> buckets;
  int checked = 0;
  for (int64_t rows = 1; rows <= 3000; rows += 1) {
    const bool compare = rows % 97 == 1 || rows == 3000;  // every size runs; some are compared
    const uint64_t seed = 900 + uint64_t(rows);
    if (compare) {
      run_case({rows, 256, 128, false, true}, DType::kBF16, DType::kBF16, 1.0f, 0.0f, seed);   // forward
      run_case({256, 128, rows, true, false}, DType::kBF16, DType::kF32, 1.0f, 1.0f, seed);    // weight gradient
      ++checked;
    } else {
      Tensor x = gpu().empty({rows, 128}, DType::kBF16, MemCategory::kTemporaries);
      Tensor w = gpu().empty({256, 128}, DType::kBF16, MemCategory::kTemporaries);
      Tensor y = gpu().empty({rows, 256}, DType::kBF16, MemCategory::kTemporaries);
      Tensor dw = gpu().empty({256, 128}, DType::kF32, MemCategory::kTemporaries);
      gpu().fill(x, 0.5f);
      gpu().fill(w, 0.25f);
      gpu().fill(dw, 0.0f);
      gpu().matmul(x, false, w, true, y, 1.0f, 0.0f);
      gpu().matmul(y, true, x, false, dw, 1.0f, 1.0f);
    }
    buckets.insert(gemm_size_bucket(rows));
  }
  gpu().synchronize();
  const CudaDevice::MatmulCacheStats after = dev.matmul_cache_stats();
  BOOST_TEST(checked > 20);
  // Two GEMM shapes per row count, a few alignments (the random pairs and the plain tensors
  // are all 256-byte aligned): the heuristic runs about once per (shape, bucket), never per size.
  const int64_t asked = after.heuristic_calls - before.heuristic_calls;
  BOOST_TEST_MESSAGE("heuristic calls " << asked << " for 6000 GEMMs over " << buckets.size() << " buckets; plans "
                                        << after.plans << " of " << after.plan_capacity << ", evictions "
                                        << after.plan_evictions);
  BOOST_TEST(asked <= int64_t(4 * buckets.size()));
  BOOST_TEST(after.plans <= after.plan_capacity);
  BOOST_TEST(after.plan_evictions > before.plan_evictions);  // 6000 exact problems > capacity
}

// Views at element offset 1 are 4- (f32) or 2-byte (bf16) aligned. The same shapes run aligned
// first, so a plan cached without the alignment would be reused wrongly here.
BOOST_AUTO_TEST_CASE(matmul_misaligned_views) {
  uint64_t seed = 500;
  for (DType ab : {DType::kF32, DType::kBF16})
    for (DType cd : {DType::kF32, DType::kBF16}) {
      if (ab == DType::kF32 && cd == DType::kBF16) continue;
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const Case c{64, 48, 40, ta, tb};
          run_case(c, ab, cd, 1.0f, 0.0f, seed += 10);  // aligned: plans with 256-byte alignment
          for (int64_t off_a : {0, 1})
            for (int64_t off_b : {0, 1})
              for (int64_t off_c : {0, 1}) {
                if (off_a + off_b + off_c == 0) continue;
                Pair a = offset_pair(a_shape(c), ab, off_a, seed += 10, false);
                Pair b = offset_pair(b_shape(c), ab, off_b, seed += 10, false);
                Pair out = offset_pair({c.m, c.n}, cd, off_c, 0, true);
                cpu().matmul(a.c, ta, b.c, tb, out.c, 1.0f, 0.0f);
                gpu().matmul(a.g, ta, b.g, tb, out.g, 1.0f, 0.0f);
                expect_close(out, ab, label(c, 1.0f, 0.0f) + " offsets A/B/C " + std::to_string(off_a) + "/" +
                                          std::to_string(off_b) + "/" + std::to_string(off_c) + " C " +
                                          dtype_name(cd));
              }
        }
    }
}

BOOST_AUTO_TEST_CASE(matmul_edge_shapes) {
  // K = 0: C = beta·C (an empty sum), with no cuBLASLt call.
  Pair a = random_pair({5, 0}, DType::kF32, 600), b = random_pair({0, 7}, DType::kF32, 601);
  Pair zero = output_pair({5, 7}, DType::kF32);
  gpu().matmul(a.g, false, b.g, false, zero.g, 1.0f, 0.0f);
  expect_close(zero, DType::kF32, "K = 0, beta = 0 zeroes C");
  // M = 0: nothing to do, nothing to throw.
  Pair a0 = random_pair({0, 3}, DType::kF32, 602), b0 = random_pair({3, 4}, DType::kF32, 603);
  Tensor c0 = gpu().empty({0, 4}, DType::kF32, MemCategory::kTemporaries);
  BOOST_CHECK_NO_THROW(gpu().matmul(a0.g, false, b0.g, false, c0, 1.0f, 0.0f));
}

BOOST_AUTO_TEST_CASE(matmul_rejects_bad_arguments) {
  Tensor a = gpu().empty({4, 3}, DType::kF32, MemCategory::kTemporaries);
  Tensor b = gpu().empty({3, 5}, DType::kF32, MemCategory::kTemporaries);
  Tensor c = gpu().empty({4, 5}, DType::kF32, MemCategory::kTemporaries);
  Tensor c_wrong = gpu().empty({5, 4}, DType::kF32, MemCategory::kTemporaries);
  Tensor b16 = gpu().empty({3, 5}, DType::kBF16, MemCategory::kTemporaries);
  Tensor a16 = gpu().empty({4, 3}, DType::kBF16, MemCategory::kTemporaries);
  Tensor c16 = gpu().empty({4, 5}, DType::kBF16, MemCategory::kTemporaries);
  Tensor ai = gpu().empty({4, 3}, DType::kI32, MemCategory::kTemporaries);
  Tensor flat = gpu().empty({12}, DType::kF32, MemCategory::kTemporaries);
  BOOST_CHECK_THROW(gpu().matmul(a, false, b, false, c_wrong, 1, 0), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().matmul(a, true, b, false, c, 1, 0), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().matmul(flat, false, b, false, c, 1, 0), std::invalid_argument);
  BOOST_CHECK_THROW(gpu().matmul(a, false, b16, false, c, 1, 0), std::invalid_argument);   // mixed A/B
  BOOST_CHECK_THROW(gpu().matmul(a, false, b, false, c16, 1, 0), std::invalid_argument);   // f32 in, bf16 out
  BOOST_CHECK_THROW(gpu().matmul(ai, false, b, false, c, 1, 0), std::invalid_argument);    // i32
  BOOST_CHECK_NO_THROW(gpu().matmul(a16, false, b16, false, c16, 1, 0));
  gpu().synchronize();
}

BOOST_AUTO_TEST_CASE(upload_download_round_trip) {
  // Sizes around the 4 MiB bounce buffers (one chunk, several, a ragged tail), odd byte counts.
  for (size_t bytes : {size_t(1), size_t(4096), size_t(4) << 20, (size_t(10) << 20) + 3, size_t(33) << 20}) {
    std::vector<unsigned char> src(bytes), back(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>((i * 131 + bytes) & 0xFF);
    Tensor t = gpu().empty({int64_t(bytes)}, DType::kBF16, MemCategory::kTemporaries);  // 2·bytes, only `bytes` used
    gpu().upload(t, src.data(), bytes);
    // The source buffer may be reused at once: scribble over it before the data is read back.
    std::vector<unsigned char> expect = src;
    std::memset(src.data(), 0xAB, bytes);
    gpu().download(back.data(), t, bytes);
    BOOST_TEST((back == expect), "round trip of " << bytes << " bytes");
  }
  // Many small uploads back to back (more than the bounce buffers) land in order.
  Tensor many = gpu().empty({64}, DType::kI32, MemCategory::kTemporaries);
  for (int32_t i = 0; i < 64; ++i) {
    std::vector<int32_t> v(64, i);
    gpu().upload(many, v.data(), v.size() * 4);
  }
  std::vector<int32_t> last(64, -1);
  gpu().download(last.data(), many, 64 * 4);
  BOOST_TEST(last == std::vector<int32_t>(64, 63), boost::test_tools::per_element());
  // A view at an odd element offset.
  Tensor big = gpu().zeros({100}, DType::kF32, MemCategory::kTemporaries);
  Tensor mid = big.view({10}, 37);
  std::vector<float> ten(10);
  for (int i = 0; i < 10; ++i) ten[size_t(i)] = float(i) + 0.5f;
  gpu().upload(mid, ten.data(), 40);
  std::vector<float> all(100, -1.0f);
  gpu().download(all.data(), big, 400);
  for (int i = 0; i < 100; ++i) BOOST_TEST(all[size_t(i)] == (i >= 37 && i < 47 ? float(i - 37) + 0.5f : 0.0f));
  // More bytes than the tensor holds: the CPU backend's exception.
  BOOST_CHECK_THROW(gpu().upload(mid, ten.data(), 44), std::out_of_range);
  BOOST_CHECK_THROW(gpu().download(ten.data(), mid, 44), std::out_of_range);
  BOOST_CHECK_NO_THROW(gpu().upload(mid, nullptr, 0));
}

BOOST_AUTO_TEST_CASE(allocator_accounting) {
  gpu().synchronize();
  Allocator* alloc = gpu().allocator();
  const MemoryStats before = alloc->stats();
  alloc->reset_peaks();
  {
    Tensor p = gpu().empty({1000}, DType::kF32, MemCategory::kParameters);        // 4000 B
    Tensor g = gpu().empty({3000}, DType::kBF16, MemCategory::kGradients);        // 6000 B
    Tensor o = gpu().empty({1 << 20}, DType::kF32, MemCategory::kOptimizer);      // 4 MiB
    const MemoryStats s = alloc->stats();
    const int P = int(MemCategory::kParameters), G = int(MemCategory::kGradients), O = int(MemCategory::kOptimizer);
    BOOST_TEST(s.in_use[P] - before.in_use[P] == 4000);
    BOOST_TEST(s.in_use[G] - before.in_use[G] == 6000);
    BOOST_TEST(s.in_use[O] - before.in_use[O] == int64_t(4) << 20);
    BOOST_TEST(s.total_in_use - before.total_in_use == 4000 + 6000 + (int64_t(4) << 20));
    BOOST_TEST(s.peak[O] >= s.in_use[O]);
    BOOST_TEST(s.total_peak >= s.total_in_use);
    BOOST_TEST(s.reserved_bytes >= s.total_in_use);
  }
  const MemoryStats after = alloc->stats();
  BOOST_TEST(after.total_in_use == before.total_in_use);
  BOOST_TEST(after.peak[int(MemCategory::kOptimizer)] >= int64_t(4) << 20);  // the peak outlives the tensor
  BOOST_TEST(after.cached_bytes >= int64_t(4) << 20);                        // freed blocks stay cached
  alloc->reset_peaks();
  BOOST_TEST(alloc->stats().total_peak == alloc->stats().total_in_use);
  // A block freed and asked for again comes from the cache: reserved memory does not grow.
  const int64_t reserved = alloc->stats().reserved_bytes;
  { Tensor again = gpu().empty({1 << 20}, DType::kF32, MemCategory::kActivations); }
  BOOST_TEST(alloc->stats().reserved_bytes == reserved);
}

BOOST_AUTO_TEST_CASE(out_of_memory_names_the_sizes) {
  size_t free_b = 0, total_b = 0;
  BOOST_REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  try {
    // Twice the GPU's memory: a plain out-of-memory (not an invalid size).
    Tensor huge = gpu().empty({int64_t(total_b / 2)}, DType::kF32, MemCategory::kActivations);
    BOOST_FAIL("allocating twice the GPU's memory succeeded");
  } catch (const std::bad_alloc& e) {
    const std::string msg = e.what();
    BOOST_TEST_MESSAGE(msg);
    BOOST_TEST(msg.find("bytes") != std::string::npos);
    BOOST_TEST(msg.find("free") != std::string::npos);
  }
  // The device is still usable afterwards (the error was not sticky).
  Pair a = random_pair({8, 8}, DType::kF32, 700), b = random_pair({8, 8}, DType::kF32, 701);
  Pair out = output_pair({8, 8}, DType::kF32);
  cpu().matmul(a.c, false, b.c, false, out.c, 1.0f, 0.0f);
  gpu().matmul(a.g, false, b.g, false, out.g, 1.0f, 0.0f);
  expect_close(out, DType::kF32, "matmul after an out-of-memory error");
  gpu().synchronize();
}

BOOST_AUTO_TEST_CASE(streams_order_compute_and_comm) {
  auto& dev = dynamic_cast<CudaDevice&>(gpu());
  // A copy on the communication stream that must see an upload queued on the compute stream,
  // and a download (compute stream) that must see the copy.
  Tensor src = gpu().empty({1 << 20}, DType::kF32, MemCategory::kTemporaries);
  Tensor dst = gpu().zeros({1 << 20}, DType::kF32, MemCategory::kTemporaries);
  std::vector<float> v(size_t(1) << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 977);
  gpu().upload(src, v.data(), src.nbytes());
  dev.comm_wait_for_compute();
  BOOST_REQUIRE(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, dev.comm_stream()) ==
                cudaSuccess);
  dev.compute_wait_for_comm();
  std::vector<float> back(v.size());
  gpu().download(back.data(), dst, dst.nbytes());
  BOOST_TEST((back == v));
  BOOST_CHECK_NO_THROW(gpu().synchronize());
}

int main(int argc, char** argv) { return meshtrain::gputest::gpu_test_main(argc, argv); }
