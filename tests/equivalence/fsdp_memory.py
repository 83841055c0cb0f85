#!/usr/bin/env python3
"""FSDP memory test: per-rank bytes of parameters + gradients + optimizer state, as the
allocator's per-category peaks in metrics.jsonl's summary (max over ranks), fall as 1/dp_shard.

For dp_shard = N every parameter of R rows × C elements is held as ceil(R/N) rows, padded to a
multiple of 16 elements; parameters, gradients, exp_avg and exp_avg_sq are 4 bytes each, so
    bytes(N) = 16 · Σ_p align16(ceil(R_p/N)·C_p)      (exactly)
    bytes(1)/N <= bytes(N) <= bytes(1)/N + 16 · Σ_p (C_p + 16)   (padding: one row + alignment)
Shapes come from the single-rank run's model_final.h5.

The final model is written by the sharded checkpoint writer, so its memory peak (the
final_model_save event, largest rank) must stay within the training peak (the largest
memory_peak_bytes of the step records): gathering every parameter for it would not.

usage: fsdp_memory.py --meshtrain BIN --deck DECK --data H5 --out DIR [--shards 1 2 4 8] [-- overrides]
"""
import json
import math
import os
import sys

import h5py

from compare_runs import launch, run_arguments


def align16(n):
    return (n + 15) // 16 * 16


def run(args, n):
    out = launch(args, n, f"fsdp{n}", ["--parallelism.data_parallel_replicate_degree=1",
                                       f"--parallelism.data_parallel_shard_degree={n}"])
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    train_peak = max(r["memory_peak_bytes"] for r in records if "loss" in r)
    final = [r for r in records if r.get("event") == "final_model_save"]
    final_peak = final[0]["memory_peak_bytes"] if final else None
    return out, dict(records[-1]["memory_peak_bytes_by_category"], train_peak=train_peak, final_peak=final_peak)


def main():
    p = run_arguments(__doc__)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args()
    if args.shards[0] != 1:
        sys.exit("the first --shards entry must be 1 (the unsharded reference)")
    out1, cats1 = run(args, 1)
    with h5py.File(os.path.join(out1, "model_final.h5"), "r") as f:
        shapes = [f["model"][k].shape for k in f["model"]]
    state = lambda c: c["parameters"] + c["gradients"] + c["optimizer"]
    b1 = state(cats1)
    pad = 16 * sum(math.prod(s[1:]) + 16 for s in shapes)
    failed = False
    print(f"{'dp_shard':>8} {'params':>10} {'grads':>10} {'optim':>10} {'total':>10} {'formula':>10} {'x N / N=1':>10}"
          f" {'activations':>12} {'communication':>14} {'train peak':>11} {'final write':>11}")
    for n in args.shards:
        cats = cats1 if n == 1 else run(args, n)[1]
        b = state(cats)
        formula = 16 * sum(align16(-(-s[0] // n) * math.prod(s[1:])) for s in shapes)
        final_ok = cats["final_peak"] is not None and cats["final_peak"] <= cats["train_peak"]
        ok = b == formula and b1 / n <= b <= b1 / n + pad and final_ok
        failed |= not ok
        print(f"{n:>8} {cats['parameters']:>10} {cats['gradients']:>10} {cats['optimizer']:>10} {b:>10} {formula:>10}"
              f" {b * n / b1:>10.4f} {cats['activations']:>12} {cats['communication']:>14} {cats['train_peak']:>11}"
              f" {cats['final_peak']!s:>11} {'ok' if ok else 'FAIL'}")
    print(f"padding allowance {pad} bytes")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
