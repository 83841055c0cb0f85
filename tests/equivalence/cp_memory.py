#!/usr/bin/env python3
"""Context-parallel memory test: each rank's activation bytes (the allocator's "activations"
category, peak over the run, largest rank, from metrics.jsonl's summary) fall as 1/cp.

Every activation a layer keeps for backward is per token, and a cp rank holds seq_len / cp of
each sample's tokens; what does not shrink (the RoPE tables of the whole sequence, a few scalars)
is small at long sequences. So for each cp in --cp (the first must be 1):
    | activations(cp) · cp / activations(1) − 1 | <= --tol          (default 0.10)
The K/V that all-gather or ring attention hold for one layer at a time are the "communication"
category and are reported, not checked.

usage: cp_memory.py --meshtrain BIN --deck DECK --data H5 --out DIR [--cp 1 2 4] [--tol 0.1] [-- overrides]
"""
import json
import os
import sys

from compare_runs import launch, run_arguments


def peaks(args, cp):
    out = launch(args, cp, f"cp{cp}", [f"--parallelism.context_parallel_degree={cp}",
                                       "--parallelism.data_parallel_shard_degree=1"])
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return records[-1]["memory_peak_bytes_by_category"]


def main():
    p = run_arguments(__doc__)
    p.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--tol", type=float, default=0.10)
    args = p.parse_args()
    if args.cp[0] != 1:
        sys.exit("the first --cp entry must be 1 (the whole sequence on one rank)")
    ref = peaks(args, 1)["activations"]
    print(f"cp 1: activations {ref / 2**20:.1f} MiB per rank")
    failed = False
    for cp in args.cp[1:]:
        c = peaks(args, cp)
        ratio = c["activations"] * cp / ref
        ok = abs(ratio - 1) <= args.tol
        failed |= not ok
        print(f"cp {cp}: activations {c['activations'] / 2**20:.1f} MiB per rank = {ratio:.4f} x (cp 1) / {cp}, "
              f"communication {c['communication'] / 2**20:.1f} MiB -> {'ok' if ok else 'FAIL'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
