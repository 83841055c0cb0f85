#!/usr/bin/env python3
"""Predicted against measured step time of `meshtrain plan`'s model on this machine's CPU ranks.

For every layout of tests/plan/memory_accuracy.py (DDP, FSDP, ZeRO-1/2, HSDP, TP, TP x FSDP,
pipeline schedules, CP, MoE, EP, activation checkpointing) on the wider model: train --steps on
CPU ranks and take the median step time of the steps after the first two, and ask `meshtrain
plan --fixed all --hardware cpu` for the same deck. Prints each layout's predicted and measured
seconds, the error, and the mean absolute error; --json writes them.

The cpu catalog entry models ranks that share a node's cores: its devices_per_node is the
core count (2 here), and when more ranks than cores run on the node, each rank's compute time
is multiplied by ranks / cores (they time-slice the cores). Calibration: peak_fp32_flops is
the single-rank sgemm rate train measures at start-up on this machine; the efficiencies were set
on the `single` row only (doc/plan.md).

usage: plan_accuracy.py [--meshtrain BIN] [--data H5] [--steps 8] [--json OUT] [--cp-data H5] [--only TAG,...]
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "plan"))
from memory_accuracy import LAYOUTS, MODELS, plan_fixed, train  # noqa: E402


P = "--parallelism."
# Context parallelism at long sequences (2 blocks, dim 256; local batch 1): one rank against cp 2
# with each rotate method, at seq 2048, 4096 and 8192. They need a corpus of more than 8k tokens
# per document split (--cp-data: `meshtrain data prepare --vocab-size 2048` of any text).
CP_LAYOUTS = []
for seq in (2048, 4096, 8192):
    base = ["--training.local_batch_size=1", "--training.global_batch_size=1", f"--training.seq_len={seq}"]
    CP_LAYOUTS += [(f"single_s{seq}", 1, base),
                   (f"cp2_allgather_s{seq}", 2, base + [P + "context_parallel_degree=2", P + "data_parallel_shard_degree=1",
                                                        P + "context_parallel_rotate_method=allgather"]),
                   (f"cp2_ring_s{seq}", 2, base + [P + "context_parallel_degree=2", P + "data_parallel_shard_degree=1",
                                                   P + "context_parallel_rotate_method=alltoall"])]


def measure(a, tag, np_, over):
    recs = train(a, tag, np_, over, steps=a.steps)
    return statistics.median(r["step_time_s"] for r in recs if "step_time_s" in r and r.get("step", 0) > 2)


def predict(a, tag, np_, over):
    return plan_fixed(a, tag, np_, over, extra=["--hardware", "cpu"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", default=os.path.join(ROOT, "build", "bin", "meshtrain"))
    ap.add_argument("--deck", default=os.path.join(ROOT, "tests", "equivalence", "tiny.toml"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "tests", "equivalence", "tiny.h5"))
    ap.add_argument("--out", default="/tmp/meshtrain_plan_accuracy")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", default="wide", choices=sorted(MODELS))
    ap.add_argument("--json")
    ap.add_argument("--cp-data", help="corpus for the long-sequence CP rows (omitted: those rows are skipped)")
    ap.add_argument("--only", help="comma-separated layout tags to run (default: all)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    print(f"{'layout':<18} {'ranks':>5} {'measured s':>11} {'predicted s':>12} {'error':>8}   predicted split")
    layouts = [(t, n, MODELS[a.model] + lay, None) for t, n, lay in LAYOUTS]
    if a.cp_data:
        layouts += [(t, n, MODELS[a.model] + lay, a.cp_data) for t, n, lay in CP_LAYOUTS]
    only = set(a.only.split(",")) if a.only else None
    for tag, np_, over, data in layouts:
        if only and tag not in only:
            continue
        if data:
            over = over + [f"--training.dataset={data}"]
        m = measure(a, tag, np_, over)
        p = predict(a, tag, np_, over)
        err = (p["step_s"] - m) / m
        rows.append({"layout": tag, "ranks": np_, "measured_s": m, "predicted_s": p["step_s"], "error": err,
                     "compute_s": p["compute_s"], "exposed_comm_s": p["exposed_comm_s"], "bubble_s": p["bubble_s"]})
        print(f"{tag:<18} {np_:>5} {m:>11.4f} {p['step_s']:>12.4f} {err:>+8.1%}   compute {p['compute_s']:.4f}, "
              f"comm {p['exposed_comm_s']:.4f}, bubble {p['bubble_s']:.4f}")
    mean = sum(abs(r["error"]) for r in rows) / len(rows)
    print(f"mean absolute error {mean:.1%} over {len(rows)} layouts")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "mean_abs_error": mean}, f, indent=1)


if __name__ == "__main__":
    main()
