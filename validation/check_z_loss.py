#!/usr/bin/env python3
"""Checks meshtrain's output head with PaLM's z-loss (and chunked cross-entropy) against an
independent float64 PyTorch formula: dump_output_head's inputs x [N, D], RMSNorm weight [D],
output weight [V, D] and targets [N] give

    h = x / sqrt(mean(x^2) + eps) * norm,   logits = h W^T,   lse = logsumexp(logits)
    CE = sum_n (lse_n - logits[n, t_n]),    Z = zeta * sum_n lse_n^2   (PaLM, Chowdhery et al. 2022, section 5)

and autograd of grad_scale * (CE + Z) gives dx, dnorm, dW. meshtrain's fp32 loss_sum must equal CE
and its z_loss_sum Z to --tol relative, and each gradient to --tol (max|ref - got| / max|ref|).
Exits 1 on a mismatch.

usage: /usr/bin/python3 validation/check_z_loss.py DUMP_DIR [--tol 1e-5]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dump", help="folder written by dump_output_head (head.json and the raw arrays)")
    p.add_argument("--tol", type=float, default=1e-5, help="largest relative error allowed (default 1e-5)")
    args = p.parse_args()
    torch.set_num_threads(1)
    meta = json.load(open(os.path.join(args.dump, "head.json")))
    n, d, v = meta["tokens"], meta["dim"], meta["vocab"]

    def load(name, shape, dtype=np.float32):
        a = np.fromfile(os.path.join(args.dump, name), dtype=dtype)
        if a.size != int(np.prod(shape)):
            sys.exit(f"{name}: {a.size} elements, expected {shape}")
        return torch.from_numpy(a.reshape(shape).astype(np.float64 if dtype == np.float32 else np.int64))

    x = load("x.f32", (n, d)).requires_grad_()
    norm = load("norm.f32", (d,)).requires_grad_()
    w = load("w.f32", (v, d)).requires_grad_()
    t = load("targets.i32", (n,), np.int32)

    def losses():
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + meta["eps"]) * norm
        logits = h @ w.T
        lse = torch.logsumexp(logits, dim=-1)
        return (lse - logits.gather(1, t[:, None])[:, 0]).sum(), meta["zeta"] * lse.pow(2).sum()

    ce, z = losses()
    (meta["grad_scale"] * (ce + z)).backward()

    failures = []

    def compare(name, ref, got):
        ref = np.asarray(ref, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        err = float(np.max(np.abs(ref - got)) / max(np.max(np.abs(ref)), 1e-300))
        print(f"{name:>10}: relative error {err:.2e}")
        if not err <= args.tol:
            failures.append(name)

    compare("loss_sum", ce.item(), meta["loss_sum"])
    compare("z_loss_sum", z.item(), meta["z_loss_sum"])
    compare("dx", x.grad.numpy(), load("dx.f32", (n, d)).numpy())
    compare("dnorm", norm.grad.numpy(), load("dnorm.f32", (d,)).numpy())
    compare("dW", w.grad.numpy(), load("dw.f32", (v, d)).numpy())
    # The z-loss must matter here, or the check proves nothing about its gradient.
    if meta["zeta"] > 0:
        w_ce = torch.autograd.grad(meta["grad_scale"] * losses()[0], w)[0]
        moved = float((w.grad - w_ce).abs().max() / w.grad.abs().max())
        print(f"z-loss share of dW: {moved:.2e}")
        if moved < 100 * args.tol:
            failures.append("z-loss too small to check")
    if failures:
        print("FAILED: " + ", ".join(failures))
        sys.exit(1)
    print(f"OK: chunk {meta['chunk']}, zeta {meta['zeta']}, {n} tokens")


if __name__ == "__main__":
    main()
