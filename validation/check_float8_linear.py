#!/usr/bin/env python3
"""A Float8 linear layer's three GEMMs (src/model/layers/primitives.cpp on the CPU device)
against an independent NumPy emulation, bit for bit, for each of TorchAO's recipes.

The layer y = x · Wᵀ (x [M, K], W [N, K], dy [M, N]) computes y, dx = dy · W and dW = dyᵀ · x,
each GEMM reading its operands through the recipe's casts (torchao/float8/config.py,
Float8LinearConfig.from_recipe_name), written out here from TorchAO's definitions:
  tensorwise:         x, W e4m3, dy e5m2, one scale per tensor;
  rowwise:            every operand e4m3, scaled per row / column along the GEMM's reduction
                      dimension, power-of-two scales;
  rowwise_with_gw_hp: y as rowwise; dx from dy (rowwise) and W (tensorwise), e4m3, power-of-two
                      scales; dW from the float32 operands.
The casts come from check_float8.py's NumPy emulation (fake_quantize_ref). The inputs are built
so that every GEMM sum is exact in float32 whatever the summation order (magnitudes k · 2^e with
k an integer in [32, 56], one k = 56 per tensor so that the tensorwise scales are powers of two),
which makes OpenBLAS's float32 GEMM and NumPy's float64 one comparable bit for bit; the casts
still round (e4m3 keeps multiples of 4 of k, e5m2 of 8, ties to even). The weight gradient is
checked twice: computed in backward and deferred to the split backward's queue.

usage: check_float8_linear.py --dump BIN --out DIR
"""
import argparse
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_float8 import fake_quantize_ref  # noqa: E402

M, K, N = 24, 32, 16
# operand casts per GEMM: (format, scaling of the operand as stored) or None (float32)
RECIPES = {
    "tensorwise": dict(pow2=False, y=(("e4m3", "tensorwise"), ("e4m3", "tensorwise")),
                       dx=(("e5m2", "tensorwise"), ("e4m3", "tensorwise")),
                       dw=(("e5m2", "tensorwise"), ("e4m3", "tensorwise"))),
    "rowwise": dict(pow2=True, y=(("e4m3", "rowwise"), ("e4m3", "rowwise")),
                    dx=(("e4m3", "rowwise"), ("e4m3", "columnwise")),
                    dw=(("e4m3", "columnwise"), ("e4m3", "columnwise"))),
    "rowwise_with_gw_hp": dict(pow2=True, y=(("e4m3", "rowwise"), ("e4m3", "rowwise")),
                               dx=(("e4m3", "rowwise"), ("e4m3", "tensorwise")),
                               dw=(None, None)),
}


def operand(rng, rows, cols, exp):
    k = rng.integers(32, 57, size=(rows, cols)).astype(np.float32)
    k[rng.integers(rows), rng.integers(cols)] = 56.0
    sign = np.where(rng.random((rows, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
    return (sign * k * np.float32(2.0 ** exp)).astype(np.float32)


def cast(t, c, pow2):
    return t if c is None else fake_quantize_ref(t, c[0], c[1], pow2)[0]


def gemm(a, b):
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="the dump_float8_linear binary")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(33)
    x, w, dy = operand(rng, M, K, -6), operand(rng, N, K, -8), operand(rng, M, N, -10)
    for name, t in (("x", x), ("w", w), ("dy", dy)):
        t.astype("<f4").tofile(os.path.join(a.out, name + ".f32"))
    failed = 0
    for recipe, r in RECIPES.items():
        subprocess.run([a.dump, recipe, str(M), str(K), str(N), a.out], check=True)
        p = r["pow2"]
        want = {
            "y": gemm(cast(x, r["y"][0], p), cast(w, r["y"][1], p).T),
            "dx": gemm(cast(dy, r["dx"][0], p), cast(w, r["dx"][1], p)),
            "dw": gemm(cast(dy, r["dw"][0], p).T, cast(x, r["dw"][1], p)),
        }
        want["dw_deferred"] = want["dw"]
        plain = {"y": gemm(x, w.T), "dx": gemm(dy, w), "dw": gemm(dy.T, x)}
        for out, ref in want.items():
            got = np.fromfile(os.path.join(a.out, f"{recipe}_{out}.f32"), "<f4").reshape(ref.shape)
            bad = int((got.view(np.uint32) != ref.view(np.uint32)).sum())
            quantized = out.replace("_deferred", "")
            changed = not np.array_equal(ref, plain[quantized])
            print(f"{recipe} {out} {list(ref.shape)}: {bad} of {ref.size} values differ from NumPy"
                  f" ({'casts change the result' if changed else 'float32 GEMM'})")
            failed += bad
            if r[quantized][0] is not None and not changed:
                print(f"  FAIL: {recipe} {out} equals the float32 GEMM: the casts did not round anything")
                failed += 1
    if failed:
        sys.exit(f"FAIL: {failed} differences from the NumPy emulation")
    print("float8 linear: y, dx and dW of every recipe bitwise equal to the NumPy emulation")


if __name__ == "__main__":
    main()
