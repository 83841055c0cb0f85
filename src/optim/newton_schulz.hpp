#pragma once
/// @file The Newton–Schulz orthogonalization at the heart of Muon (Jordan et al. 2024, "Muon: An
/// optimizer for hidden layers in neural networks"): for G [m, n] with SVD U S Vᵀ it returns
/// approximately U Vᵀ (every singular value pushed into about [0.7, 1.2]) using matrix products
/// only, so it runs at GEMM speed on any device:
///
///     X₀ = G / (‖G‖_F + 1e-7)
///     Xₖ₊₁ = a·Xₖ + (b·A + c·A²)·Xₖ,   A = Xₖ·Xₖᵀ,   (a, b, c) = (3.4445, −4.7750, 2.0315)
///
/// the quintic iteration whose coefficients maximize the slope at zero. A tall G (m > n) is
/// iterated on its transpose so that A is the smaller Gram matrix, [min(m, n)]². Cost per
/// iteration for k = min(m, n), l = max(m, n): 4·k²·l + 2·k³ flops (A, A², B·X).
#include "device/device.hpp"

namespace meshtrain {

/// Muon's quintic coefficients (a, b, c).
struct NewtonSchulzCoefficients {
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;
};

/// Replaces g [m, n] (f32, contiguous) by its `steps`-iteration orthogonalization (see file
/// comment), in f32 on `dev`; temporaries [k, k] ×2 and [m, n] come from the device's allocator
/// (MemCategory::kTemporaries). steps = 0 only normalizes. A zero matrix stays zero.
/// @throws std::invalid_argument unless g is a 2-D f32 tensor, or steps < 0.
void newton_schulz_orthogonalize(Device& dev, const Tensor& g, int steps, NewtonSchulzCoefficients coef = {});

/// Flops of newton_schulz_orthogonalize on an [m, n] matrix: steps·(4·k²·l + 2·k³), k = min(m,n),
/// l = max(m, n) (the normalization and the additions are not counted).
double newton_schulz_flops(int64_t m, int64_t n, int steps);

}  // namespace meshtrain
