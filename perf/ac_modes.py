#!/usr/bin/env python3
"""Activation checkpointing modes side by side: none, per-operator selective ("op"), selective
every 2nd block and full, on a few CPU layouts. For each (layout, mode) it trains a few steps
and reports, for the largest rank:
  - the measured activation peak (the allocator's activations category, summary record) and
    the planner's prediction for the same deck (`meshtrain plan --fixed all --json`);
  - the measured step time (the fastest step after the first: on a shared machine the least
    disturbed one) and the planner's step time;
  - the CPU seconds the whole run took (user + system of every rank: start-up included, the same
    for every mode), steadier than wall time on a machine other work shares (multi-rank runs
    also count MPI's busy waiting).
Memory is deterministic; times on a shared machine are not (run it alone, under the build
lock, and read them as ratios to the "none" row of the same layout).

usage: ac_modes.py --meshtrain BIN --deck DECK --data H5 --out DIR [--steps 6] [--layouts single tp2 ...]
                   [-- --section.key=value ...]   (overrides for every run)
"""
import argparse
import os
import resource
import sys

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
sys.path[:0] = [os.path.join(TESTS, "plan"), os.path.join(TESTS, "equivalence")]
from compare_runs import run_arguments  # noqa: E402
from memory_accuracy import MOE, P, plan_fixed, train  # noqa: E402

# The "wide" model of tests/plan/memory_accuracy.py with 4 blocks and 4 samples per micro-batch:
# activations well above the parameters' and optimizer's bytes.
MODEL = ["--model.dim=256", "--model.n_heads=8", "--model.n_kv_heads=4", "--model.vocab_size=2048",
         "--model.n_layers=4", "--training.seq_len=128", "--training.local_batch_size=4"]
MODES = {
    "none": ["--activation_checkpoint.mode=none"],
    "op": ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op"],
    "selective 2": ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=2"],
    "full": ["--activation_checkpoint.mode=full"],
}
LAYOUTS = {  # name: (ranks, overrides)
    "single": (1, ["--training.global_batch_size=4"]),
    "tp2": (2, ["--training.global_batch_size=4", P + "tensor_parallel_degree=2", P + "data_parallel_shard_degree=1"]),
    "cp2_ring": (2, ["--training.global_batch_size=4", P + "context_parallel_degree=2",
                     P + "data_parallel_shard_degree=1", P + "context_parallel_rotate_method=alltoall"]),
    "moe_ep2": (2, ["--training.global_batch_size=8", P + "expert_parallel_degree=2"] + MOE),
}


def main():
    ap = run_arguments(__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print("| layout | AC | activations measured (KiB) | predicted (KiB) | error | step measured (ms) "
          "| vs none | step predicted (ms) | vs none | run CPU (s) | vs none |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for lay in a.layouts:
        np_, over = LAYOUTS[lay]
        base = None
        for mode, ac in MODES.items():
            tag = f"{lay}_{mode.replace(' ', '')}"
            o = MODEL + over + ac + a.extra
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            recs = train(a, tag, np_, o, steps=a.steps)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            act = recs[-1]["memory_peak_bytes_by_category"]["activations"]
            step = min(r["step_time_s"] for r in recs if "loss" in r and r["step"] > 1)
            plan = plan_fixed(a, tag, np_, o)
            pact, pstep = plan["memory_bytes"]["activations"], plan["step_s"]
            if base is None:
                base = (step, pstep, cpu)
            print(f"| {lay} | {mode} | {act / 1024:,.0f} | {pact / 1024:,.0f} | {(pact - act) / act:+.1%} "
                  f"| {step * 1e3:.1f} | {step / base[0]:.2f} | {pstep * 1e3:.2f} | {pstep / base[1]:.2f} "
                  f"| {cpu:.1f} | {cpu / base[2]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
