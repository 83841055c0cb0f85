#!/usr/bin/env python3
"""meshtrain's Float8 emulation (src/tensor/float8.hpp) against an independent NumPy emulation,
bit for bit.

The reference decodes all 256 codes of each format from the OCP 8-bit floating-point
specification (e4m3: bias 7, no infinities, S.1111.111 is NaN; e5m2: bias 15, exponent 31 is
inf / NaN) and rounds by looking the value up among the finite codes: the nearest one, a tie
going to the code with an even mantissa, |x| beyond the largest finite value (and ±inf)
saturating to it, NaN staying NaN, the sign kept (−0 too). Scaling follows TorchAO
(torchao/float8/float8_utils.py): amax = max |x| over the group (NaN propagating),
scale = float32(max / max(float64(amax), 1e-12)), power-of-two scales 2^floor(log2(scale))
(in float64), q = round(float32(x · scale)), dequantized float32(q / scale).

Inputs: a "finite" matrix (per-row magnitudes from 2^-40 to 2^40, values on and between the
grids, exact ties, subnormals, values near and beyond the largest finite value, ±0) and a
"special" one (rows with NaN, ±inf, all zeros). Every output element and scale must have the
same bits (NaN: both NaN).

usage: check_float8.py --dump BIN --out DIR
"""
import argparse
import os
import subprocess
import sys

import numpy as np

FORMATS = {"e4m3": (4, 3, 7, False), "e5m2": (5, 2, 15, True)}  # exponent bits, mantissa bits, bias, has inf
SCALINGS = ["tensorwise", "rowwise", "columnwise"]


def decode_all(fmt):
    """Every finite non-negative value of the format with its code's mantissa parity, sorted."""
    eb, mb, bias, has_inf = FORMATS[fmt]
    vals = []
    for code in range(1 << (eb + mb)):  # sign bit 0
        e, m = code >> mb, code & ((1 << mb) - 1)
        if has_inf and e == (1 << eb) - 1:
            continue  # inf / NaN
        if not has_inf and e == (1 << eb) - 1 and m == (1 << mb) - 1:
            continue  # e4m3fn's NaN
        v = (m / (1 << mb)) * 2.0 ** (1 - bias) if e == 0 else (1 + m / (1 << mb)) * 2.0 ** (e - bias)
        vals.append((v, m & 1))
    vals.sort()
    return np.array([v for v, _ in vals]), np.array([p for _, p in vals])


def round_ref(x, fmt):
    """x (float32 array) rounded onto the format, as float32."""
    grid, odd = decode_all(fmt)
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x.astype(np.float64))
    out = np.empty(x.shape, dtype=np.float64)
    nan = np.isnan(a)
    a = np.where(nan, 0.0, np.minimum(a, grid[-1]))
    hi = np.clip(np.searchsorted(grid, a, side="left"), 0, len(grid) - 1)  # first grid value >= a
    lo = np.clip(hi - 1, 0, len(grid) - 1)
    dlo, dhi = a - grid[lo], grid[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (odd[lo] == 1) & (hi != lo))
    pick_hi |= grid[lo] > a  # a below the first value (only a == 0 reaches here): hi == lo == 0
    out = np.where(pick_hi, grid[hi], grid[lo])
    out = np.copysign(out, x.astype(np.float64))
    out[nan] = np.nan
    return out.astype(np.float32)


def scale_ref(amax, fmt, pow2):
    fmax = decode_all(fmt)[0][-1]
    amax = np.asarray(amax, dtype=np.float32).astype(np.float64)
    s = (fmax / np.where(np.isnan(amax), amax, np.maximum(amax, 1e-12))).astype(np.float32)
    if pow2:
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.exp2(np.floor(np.log2(s.astype(np.float64)))).astype(np.float32)
        s = np.where(np.isfinite(s) & (s > 0), p, s).astype(np.float32)
    return s


def fake_quantize_ref(x, fmt, scaling, pow2):
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    if scaling == "tensorwise":
        amax = np.max(a).reshape(1, 1)
    elif scaling == "rowwise":
        amax = np.max(a, axis=1, keepdims=True)
    else:
        amax = np.max(a, axis=0, keepdims=True)
    s = scale_ref(amax, fmt, pow2)
    with np.errstate(invalid="ignore", over="ignore"):
        q = round_ref(x * s, fmt)
        out = (q / s).astype(np.float32)
    return out, s.reshape(-1)


def finite_matrix(rng):
    rows = []
    for e in range(-40, 41, 4):  # magnitudes across both formats' ranges and beyond
        rows.append(rng.standard_normal(48).astype(np.float32) * np.float32(2.0 ** e))
    for fmt in FORMATS:  # every grid value, the midpoints (ties) and quarter points, ±
        grid = decode_all(fmt)[0]
        mids = (grid[:-1] + grid[1:]) / 2
        quarts = grid[:-1] + (grid[1:] - grid[:-1]) / 4
        vals = np.concatenate([grid, mids, quarts, -grid, -mids, grid[-1] * np.array([1.01, 1.5, 3.0, 1e6])])
        vals = vals.astype(np.float32)
        vals = np.concatenate([vals, np.zeros((-len(vals)) % 48, np.float32)]).reshape(-1, 48)
        rows.extend(vals)
    rows.append(np.array([0.0, -0.0] * 24, dtype=np.float32))
    return np.stack(rows).astype(np.float32)


def special_matrix(rng):
    m = rng.standard_normal((6, 16)).astype(np.float32)
    m[0, 3] = np.nan
    m[1, 5] = np.inf
    m[2, 7] = -np.inf
    m[3, :] = 0.0
    m[4, :] = np.float32(1e-30)
    return m


def check(dump, out, name, x):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    x.astype("<f4").tofile(os.path.join(d, "in.f32"))
    subprocess.run([dump, os.path.join(d, "in.f32"), str(x.shape[0]), str(x.shape[1]), d], check=True)

    def same(got, want):
        got, want = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
        both_nan = np.isnan(got) & np.isnan(want)
        bad = ~both_nan & (got.view(np.uint32) != want.view(np.uint32))
        return int(bad.sum()), (got[bad][:3], want[bad][:3])

    failed = 0
    for fmt in FORMATS:
        n, ex = same(np.fromfile(os.path.join(d, f"round_{fmt}.f32"), "<f4"), round_ref(x, fmt))
        print(f"{name} round {fmt}: {x.size} values, {n} differ" + (f" e.g. {ex}" if n else ""))
        failed += n
        for g in SCALINGS:
            for p in (0, 1):
                tag = f"{fmt}_{g}_{p}"
                want, ws = fake_quantize_ref(x, fmt, g, p)
                n1, ex1 = same(np.fromfile(os.path.join(d, f"fq_{tag}.f32"), "<f4"), want)
                n2, ex2 = same(np.fromfile(os.path.join(d, f"scale_{tag}.f32"), "<f4"), ws)
                print(f"{name} {fmt} {g} pow2={p}: {n1} of {x.size} values and {n2} of {ws.size} scales differ"
                      + (f" e.g. {ex1} {ex2}" if n1 or n2 else ""))
                failed += n1 + n2
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="the dump_float8 binary")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = np.random.default_rng(8)
    failed = check(a.dump, a.out, "finite", finite_matrix(rng)) + check(a.dump, a.out, "special", special_matrix(rng))
    if failed:
        sys.exit(f"FAIL: {failed} values differ from the NumPy emulation")
    print("float8 emulation: every value and scale bitwise equal to the NumPy emulation")


if __name__ == "__main__":
    main()
