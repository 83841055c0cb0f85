#pragma once
/// @file Fixed-order fp64 reduction shared by the kernels that return a sum to the host
/// (cross_entropy, cross_entropy_combine, sum_squares).
#include <cuda_runtime.h>

#include <cstdint>

namespace meshtrain::cuda {

/// *out = Σ in[0, n) in fp64, in an order fixed by n alone (one block: each thread sums a
/// strided subset, then a fixed tree), so repeated calls give bitwise-identical results.
/// in, out device pointers; out may not overlap in. Asynchronous on `stream`.
/// @throws std::runtime_error on a launch error.
void launch_sum_doubles(const double* in, int64_t n, double* out, cudaStream_t stream);

}  // namespace meshtrain::cuda
