#!/usr/bin/env python3
"""Runs one deck on several data-parallel layouts and checks that each reproduces the
single-rank run: every training loss and validation loss within --tol relative, and the final
parameters (model_final.h5) within --tol relative, max over tensors of max|a-b| / max|a|.
Optionally checks that a repeated run is bitwise identical (same deck + seed + layout).

usage: compare_runs.py --meshtrain BIN --deck DECK --data H5 --out DIR --np 1 2 4 [--repeat 2]
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np


def run(args, np_, tag):
    out = os.path.join(args.out, tag)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), args.meshtrain, "train",
           "--deck", args.deck, f"--training.dataset={args.data}", f"--job.dump_folder={out}",
           f"--parallelism.data_parallel_replicate_degree={np_}"] + args.extra
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {res.returncode}\n{res.stdout}\n{res.stderr}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    losses = [r["loss"] for r in recs if "loss" in r]
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    with h5py.File(os.path.join(out, "model_final.h5"), "r") as f:
        params = {k: f["params"][k][()] for k in f["params"]}
    return losses, vals, params


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--meshtrain", required=True)
    p.add_argument("--deck", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--np", type=int, nargs="+", required=True)
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--repeat", type=int, default=0, help="also rerun this rank count and demand bitwise equality")
    p.add_argument("extra", nargs="*", help="further --section.key=value overrides for every run")
    args = p.parse_args()
    ref_np = args.np[0]
    runs = {ref_np: run(args, ref_np, f"np{ref_np}")}
    ref = runs[ref_np]
    print(f"np={ref_np}: {len(ref[0])} steps, loss {ref[0][0]:.6f} -> {ref[0][-1]:.6f}, val {ref[1]}")
    failed = False
    for n in args.np[1:]:
        cur = runs[n] = run(args, n, f"np{n}")
        if len(cur[0]) != len(ref[0]) or len(cur[1]) != len(ref[1]):
            sys.exit(f"FAIL: np={n} logged {len(cur[0])} steps / {len(cur[1])} validations, "
                     f"reference {len(ref[0])} / {len(ref[1])}")
        e_loss = max(abs(a - b) / abs(a) for a, b in zip(ref[0], cur[0]))
        e_val = max((abs(a - b) / abs(a) for a, b in zip(ref[1], cur[1])), default=0.0)
        e_par = max(rel(ref[2][k], cur[2][k]) for k in ref[2])
        ok = e_loss <= args.tol and e_val <= args.tol and e_par <= args.tol
        failed |= not ok
        print(f"np={n}: loss rel err {e_loss:.2e}, val_loss rel err {e_val:.2e}, final params rel err {e_par:.2e}"
              f" -> {'ok' if ok else 'FAIL'}")
    if args.repeat:
        if args.repeat not in runs:
            sys.exit(f"--repeat {args.repeat} must be one of --np")
        base, again = runs[args.repeat], run(args, args.repeat, f"np{args.repeat}-again")
        same = (base[0] == again[0] and base[1] == again[1]
                and all(np.array_equal(base[2][k], again[2][k]) for k in base[2]))
        failed |= not same
        print(f"np={args.repeat} repeated: {'bitwise identical' if same else 'FAIL: differs'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
