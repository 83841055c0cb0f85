#!/usr/bin/env python3
"""Checks meshtrain's Muon optimizer against an independent float64 PyTorch implementation written
from the papers, on the dump of tests/validation/dump_muon_step.cpp (two steps, synthetic
gradients).

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"), in the
momentum form of PyTorch's and Megatron-Core's Muon, for every 2-D hidden weight and every
routed expert [E, a, b] taken one expert at a time:

    M <- mu M + (1 - mu) G,   U = (1 - mu) G + mu M   (Nesterov)
    X0 = U / (||U||_F + 1e-7);  X <- a X + (b A + c A^2) X, A = X X^T   (5 times; on U^T if tall)
    W <- W (1 - lr wd) - lr * 0.2 * sqrt(max(m, n)) * X   (Moonlight, Liu et al. 2025, eq. 4)

and torch.optim.AdamW (float64) for the embedding, the output head and the norms, at
lr * adamw_lr / base_lr, weight decay only where the parameter decays. Each parameter's update
(p_k - p_{k-1}, from meshtrain's p_{k-1}) must match to --tol relative (max |ref - got| / max |ref|,
allowing one float32 unit in the last place of the stored weight), and so must the final momentum
buffers and exp_avg. Exits 1 on a mismatch.

usage: /usr/bin/python3 validation/check_muon.py DUMP_DIR [--tol 1e-5]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

A, B, C = 3.4445, -4.7750, 2.0315


def orthogonalize(g, steps):
    x = g / (torch.linalg.matrix_norm(g) + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        a = x @ x.T
        x = A * x + (B * a + C * a @ a) @ x
    return x.T if tall else x


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dump", help="folder written by dump_muon_step")
    p.add_argument("--tol", type=float, default=1e-5, help="largest relative error allowed (default 1e-5)")
    args = p.parse_args()
    torch.set_num_threads(1)
    meta = json.load(open(os.path.join(args.dump, "muon.json")))

    def load(name, ext, shape):
        a = np.fromfile(os.path.join(args.dump, f"{name}.{ext}"), dtype=np.float32)
        if a.size != int(np.prod(shape)):
            sys.exit(f"{name}.{ext}: {a.size} elements, expected {shape}")
        return torch.from_numpy(a.reshape(shape).astype(np.float64))

    mu, lrs = meta["momentum"], meta["lr"]
    worst, failures = 0.0, []

    def compare(what, ref, got, allowance=None):
        nonlocal worst
        diff = (ref - got).abs()
        if allowance is not None:
            diff = (diff - allowance).clamp(min=0)
        err = float(diff.max() / max(float(ref.abs().max()), 1e-300))
        worst = max(worst, err)
        if not err <= args.tol:
            failures.append(f"{what}: relative error {err:.2e}")

    def compare_update(what, ref_new, got_new, prev):
        # The update is compared relative to its own size; meshtrain's new weights are stored in
        # float32, so one unit in the last place of each weight is allowed on top (the update
        # of a norm weight near 1.0 is ~1e-3, whose float32 rounding alone is ~1e-5 of it).
        ulp = torch.from_numpy(np.abs(np.spacing(got_new.numpy().astype(np.float32))).astype(np.float64))
        compare(what, ref_new - prev, got_new - prev, ulp)

    for prm in meta["params"]:
        name, shape = prm["name"], prm["shape"]
        p0 = load(name, "p0", shape)
        grads = [load(name, f"g{k}", shape) for k in (1, 2)]
        got = [load(name, f"p{k}", shape) for k in (1, 2)]
        prevs = [p0, got[0]]  # step 2 starts from meshtrain's step-1 weights
        if prm["group"] == "muon":
            m = torch.zeros_like(p0)
            for k, (g, lr) in enumerate(zip(grads, lrs)):
                m = mu * m + (1 - mu) * g
                u = (1 - mu) * g + mu * m if meta["nesterov"] else m
                mats = [u] if u.dim() == 2 else list(u)  # experts one at a time
                o = torch.stack([orthogonalize(x, meta["ns_steps"]) for x in mats]).reshape(u.shape)
                scale = meta["extra_scale"] * math.sqrt(max(shape[-2], shape[-1]))
                w = prevs[k]
                compare_update(f"{name} step {k + 1} update", w * (1 - lr * meta["weight_decay"]) - lr * scale * o,
                               got[k], w)
            compare(f"{name} momentum_buffer", m, load(name, "state", shape))
        else:
            t = p0.clone().requires_grad_()
            opt = torch.optim.AdamW([t], lr=lrs[0], betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"],
                                    weight_decay=meta["weight_decay"] if prm["weight_decay"] else 0.0)
            for k, (g, lr) in enumerate(zip(grads, lrs)):
                opt.param_groups[0]["lr"] = lr * meta["adamw_lr"] / meta["base_lr"]
                with torch.no_grad():
                    t.copy_(prevs[k])
                t.grad = g.clone()
                opt.step()
                compare_update(f"{name} step {k + 1} update", t.detach().clone(), got[k], prevs[k])
            compare(f"{name} exp_avg", opt.state[t]["exp_avg"], load(name, "state", shape))
    print(f"{len(meta['params'])} parameters, 2 steps: largest relative error {worst:.2e} (tol {args.tol:g})")
    for f in failures:
        print("MISMATCH " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
