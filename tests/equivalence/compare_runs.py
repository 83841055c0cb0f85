#!/usr/bin/env python3
"""Runs one deck on several parallel layouts and checks that each reproduces the first (the
single-rank run): every training loss and validation loss within --tol relative, and the final
parameters (model_final.h5) within --tol relative, max over tensors of max|a-b| / max|a|.
Optionally checks that a repeated run is bitwise identical (same deck + seed + layout).

Mixture-of-Experts runs log each step's tokens per expert (every run gets
--metrics.moe_histogram_freq=1); those must be equal to the reference's in every step and layer.
With real routing an fp32 rounding difference can flip a near-tie top-k choice: that is reported
as a routing difference (step, layer, experts), never absorbed by the tolerances.

usage: compare_runs.py --meshtrain BIN --deck DECK --data H5 --out DIR --np 1 2 4 [--repeat 2] [-- overrides]
       compare_runs.py ... --layout "NAME NP [--section.key=value ...]" --layout ... [-- overrides]

--np N runs pure data parallelism (DDP, data_parallel_replicate_degree = N); --layout runs NP
ranks with exactly the overrides given (the deck's data_parallel_shard_degree = -1 makes the
rest FSDP). The first layout listed is the reference. Overrides after -- apply to every run.
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np


def launch(args, np_, tag, layout_args):
    """Trains args.deck on np_ ranks with layout_args + args.extra into args.out/tag; returns
    that folder. Exits the script with the command's output when training fails."""
    out = os.path.join(args.out, tag)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), args.meshtrain, "train",
           "--deck", args.deck, f"--training.dataset={args.data}", f"--job.dump_folder={out}",
           "--metrics.moe_histogram_freq=1"] + layout_args + args.extra
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {res.returncode}\n{res.stdout}\n{res.stderr}")
    return out


def run(args, np_, tag, layout_args):
    out = launch(args, np_, tag, layout_args)
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    losses = [r["loss"] for r in recs if "loss" in r]
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    norms = [r["grad_norm"] for r in recs if "grad_norm" in r]
    routing = {r["step"]: r["moe_tokens_per_expert"] for r in recs if "moe_tokens_per_expert" in r}
    with h5py.File(os.path.join(out, "model_final.h5"), "r") as f:  # a model-only checkpoint: /model/<name>
        params = {k: f["model"][k][()] for k in f["model"]}
    return losses, vals, params, norms, routing


def routing_difference(ref, cur):
    """The first step where two runs' MoE tokens-per-expert differ, as text (None: identical)."""
    if sorted(ref) != sorted(cur):
        return f"routing logged at steps {sorted(cur)}, reference {sorted(ref)}"
    for step in sorted(ref):
        for layer, (a, b) in enumerate(zip(ref[step], cur[step])):
            if a != b:
                moved = [e for e, (x, y) in enumerate(zip(a, b)) if x != y]
                return (f"routing differs at step {step}, MoE layer {layer}: experts {moved} got "
                        f"{[b[e] for e in moved]} tokens, reference {[a[e] for e in moved]} (a top-k flip)")
    return None


def rel(a, b):
    """Largest element error relative to the largest element (max |a - b| / max |a|)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))


def rel_l2(a, b):
    """Tensor relative error in the 2-norm, ||a - b|| / ||a||."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))


def run_arguments(description):
    """An argument parser with what launch() needs: --meshtrain, --deck, --data, --out and
    trailing overrides (extra)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--meshtrain", required=True)
    p.add_argument("--deck", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("extra", nargs="*", help="further --section.key=value overrides for every run")
    return p


def main():
    p = run_arguments(__doc__)
    p.add_argument("--np", type=int, nargs="+", default=[])
    p.add_argument("--layout", action="append", default=[], help='"NAME NP [--section.key=value ...]"')
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--param-metric", choices=["max", "l2"], default="max",
                   help="final parameters: max = largest element error / largest element <= tol; l2 = "
                        "per-tensor ||a-b||/||a|| <= tol and largest element error <= 100 tol (layouts that "
                        "split a matmul's reduction dimension, where Adam amplifies fp32 rounding in the "
                        "few elements whose gradient is ~eps)")
    p.add_argument("--repeat", type=int, default=0, help="also rerun this rank count and demand bitwise equality")
    args = p.parse_args()
    layouts = [(f"np{n}", n, [f"--parallelism.data_parallel_replicate_degree={n}"]) for n in args.np]
    for spec in args.layout:
        name, n, *over = spec.split()
        layouts.append((name, int(n), over))
    if not layouts:
        sys.exit("give --np or --layout")
    names = [l[0] for l in layouts]
    if len(set(names)) != len(names):
        sys.exit(f"layout names must be unique: {names}")
    ref_tag = layouts[0][0]
    runs = {ref_tag: run(args, layouts[0][1], ref_tag, layouts[0][2])}
    ref = runs[ref_tag]
    print(f"{ref_tag}: {len(ref[0])} steps, loss {ref[0][0]:.6f} -> {ref[0][-1]:.6f}, val {ref[1]}")
    failed = False
    for tag, n, over in layouts[1:]:
        cur = runs[tag] = run(args, n, tag, over)
        if len(cur[0]) != len(ref[0]) or len(cur[1]) != len(ref[1]):
            sys.exit(f"FAIL: {tag} logged {len(cur[0])} steps / {len(cur[1])} validations, "
                     f"reference {len(ref[0])} / {len(ref[1])}")
        e_loss = max(abs(a - b) / abs(a) for a, b in zip(ref[0], cur[0]))
        # The global gradient norm (which drives clipping) must count every parameter once.
        e_norm = max(abs(a - b) / abs(a) for a, b in zip(ref[3], cur[3]))
        e_val = max((abs(a - b) / abs(a) for a, b in zip(ref[1], cur[1])), default=0.0)
        missing = sorted(set(ref[2]) ^ set(cur[2]))
        if missing:
            sys.exit(f"FAIL: {tag} and {ref_tag} dumped different parameters: {missing}")
        e_par = max(rel(ref[2][k], cur[2][k]) for k in ref[2])
        e_l2 = max(rel_l2(ref[2][k], cur[2][k]) for k in ref[2])
        par_ok = e_par <= args.tol if args.param_metric == "max" else (e_l2 <= args.tol and e_par <= 100 * args.tol)
        flip = routing_difference(ref[4], cur[4])
        ok = e_loss <= args.tol and e_val <= args.tol and e_norm <= args.tol and par_ok and flip is None
        failed |= not ok
        routed = f", routing identical over {len(ref[4])} steps" if ref[4] and flip is None else ""
        print(f"{tag} ({n} ranks): loss rel err {e_loss:.2e}, val_loss rel err {e_val:.2e}, grad_norm rel err "
              f"{e_norm:.2e}, final params rel err "
              f"{e_par:.2e} (largest element), {e_l2:.2e} (2-norm){routed} -> {'ok' if ok else 'FAIL'}")
        if flip:
            print(f"  {tag}: {flip}")
    if args.repeat:
        if args.repeat not in args.np:
            sys.exit(f"--repeat {args.repeat} must be one of --np")
        base = runs[f"np{args.repeat}"]
        again = run(args, args.repeat, f"np{args.repeat}-again", [f"--parallelism.data_parallel_replicate_degree={args.repeat}"])
        same = (base[0] == again[0] and base[1] == again[1]
                and all(np.array_equal(base[2][k], again[2][k]) for k in base[2]))
        failed |= not same
        print(f"np={args.repeat} repeated: {'bitwise identical' if same else 'FAIL: differs'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
