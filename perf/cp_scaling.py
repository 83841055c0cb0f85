#!/usr/bin/env python3
"""perf/cp_scaling: context parallelism on CPU ranks. For each sequence length, cp degree and
rotate method it trains the debug model's shapes (dim 256, 16 heads; --layers blocks) on one
sample per step and reports, from metrics.jsonl:

  - tokens/s per rank (median over the steps after the first) and the step time;
  - activation bytes per rank (the allocator's "activations" peak, largest rank) and that
    figure times cp over cp 1's (1.00 = memory falling exactly as 1/cp);
  - the seconds a rank waited for the cp group's transfers (cp_wait_s, summed over the timed
    steps). All-gather and all-to-all are waited for at once, so theirs is their whole transfer
    time; the ring (alltoall) moves exactly the bytes all-gather moves (perf/comm_volume), so the
    share of its communication hidden behind block computation is 1 - wait(ring) / wait(allgather)
    at the same sequence length and cp, both measured in this run. (cp_comm_s, the ring's spans
    from post to the completion seen by polling between blocks, is recorded in the JSON; it is an
    upper bound, late by up to one block.)

With --balance it also runs all-gather with contiguous chunks (context_parallel_load_balancer =
"none"), to show what head-tail balancing saves. Then the demonstration that matters to users: at --long tokens, a step that does not fit a
rank's memory budget ([training] memory_limit_gib = --budget-gib) at cp 1 (the run stops with
the allocator's out-of-memory error) trains at cp 4.

Ranks run one OpenMP thread each; cp 4 runs 4 ranks on this machine's cores, so on a 2-core
machine its per-rank rate also carries oversubscription (the table prints the core count).

usage: /usr/bin/python3 perf/cp_scaling.py [--seq 2048 8192] [--cp 1 2 4]
           [--methods allgather alltoall ulysses] [--balance] [--long 32768] [--long-methods allgather]
           [--budget-gib 1.0] [--layers 2] [--steps 3] [--data H5] [--out DIR] [--json PATH]
           [--binary build/bin/meshtrain]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_volume import ROOT, add_run_arguments, ensure_data, machine, train, write_result  # noqa: E402

DECK = os.path.join(ROOT, "inputs/llama3_debug.toml")


def run(args, data, seq, cp, method, steps, extra=(), balancer="headtail"):
    """One configuration; returns a result row (with "error" when the run failed)."""
    tag = f"s{seq}_cp{cp}_{method}" + ("" if balancer == "headtail" else f"_{balancer}")
    out = os.path.join(args.out, tag)
    over = [f"--training.seq_len={seq}", "--training.local_batch_size=1", "--training.global_batch_size=1",
            f"--training.steps={steps}", f"--model.n_layers={args.layers}", "--model.vocab_size=512",
            f"--parallelism.context_parallel_degree={cp}", "--parallelism.data_parallel_shard_degree=1",
            f"--parallelism.context_parallel_rotate_method={method}",
            f"--parallelism.context_parallel_load_balancer={balancer}", "--lr_scheduler.warmup_steps=1", *extra]
    row = {"seq_len": seq, "cp": cp, "method": method, "balancer": balancer}
    print(f"seq {seq} cp {cp} {method} {balancer} ...", flush=True)
    recs, summary, err = train(args.binary, DECK, data, out, cp, over, threads=1, timeout=args.timeout)
    if err:
        return {**row, "error": err}
    timed = [r for r in recs if r["step"] > 1] or recs
    row["tokens_per_s_per_rank"] = statistics.median(r["tokens_per_s_per_rank"] for r in timed)
    row["step_time_s"] = statistics.median(r["step_time_s"] for r in timed)
    row["loss_last"] = recs[-1]["loss"]
    cats = summary["memory_peak_bytes_by_category"] if summary else {}
    row["activation_bytes_per_rank"] = cats.get("activations")
    row["communication_bytes_per_rank"] = cats.get("communication")
    cpr = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"cp_comm_s"' in l]
    cpr = [r for r in cpr if r["step"] > 1] or cpr
    if cpr:
        row["cp_comm_s"] = sum(r["cp_comm_s"] for r in cpr)
        row["cp_wait_s"] = sum(r["cp_wait_s"] for r in cpr)
    return row


def add_hidden(block):
    """Sets "hidden" on each ring row: 1 - its wait / the all-gather row's wait (same seq, cp)."""
    gather = {r["cp"]: r.get("cp_wait_s") for r in block if r["method"] == "allgather" and "error" not in r}
    for r in block:
        base = gather.get(r["cp"])
        if r["method"] == "alltoall" and "error" not in r and base:
            r["hidden"] = 1 - r["cp_wait_s"] / base


def fmt_row(r, ref_act):
    if "error" in r:
        first = r["error"].splitlines()[-1] if r["error"] else "failed"
        return f"{r['seq_len']:>6} {r['cp']:>3} {r['method']:<10} FAILED: {first[:150]}"
    act = r["activation_bytes_per_rank"] or 0
    ratio = f"{act * r['cp'] / ref_act:6.3f}" if ref_act else "     -"
    hidden = f"{100 * r['hidden']:5.1f}%" if r.get("hidden") is not None else "     -"
    comm = f"{r['cp_wait_s']:8.3f}" if "cp_wait_s" in r else "       -"
    return (f"{r['seq_len']:>6} {r['cp']:>3} {r['method']:<10} {r['tokens_per_s_per_rank']:>10.1f} "
            f"{r['step_time_s']:>8.2f} {act / 2**20:>10.1f} {ratio} {comm} {hidden}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--methods", nargs="+", default=["allgather", "alltoall", "ulysses"])
    p.add_argument("--long", type=int, default=32768, help="sequence of the memory-budget demonstration (0: skip)")
    p.add_argument("--long-methods", nargs="+", default=["allgather"])
    p.add_argument("--budget-gib", type=float, default=1.0, help="[training] memory_limit_gib of the demonstration")
    p.add_argument("--balance", action="store_true",
                   help="also run all-gather with contiguous chunks (load_balancer none) at each seq and cp > 1")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    add_run_arguments(p, "cp_scaling")
    args = p.parse_args()
    # A validation split of at least one sample of the longest sequence: about 5% of the
    # documents (some 600 tokens each) go there.
    longest = max(args.seq + [args.long])
    data = ensure_data(args.data, args.out, args.binary, ndocs=max(150, longest // 25))
    rows = []
    header = (f"{'seq':>6} {'cp':>3} {'method':<10} {'tok/s/rank':>10} {'step s':>8} {'act MiB':>10} "
              f"{'x cp/1':>6} {'wait s':>8} {'hidden':>6}")
    print(f"perf/cp_scaling on {machine()}, {args.layers} blocks of the debug model, 1 sample per step")
    for seq in args.seq:
        ref = None
        block = []
        for cp in args.cp:
            for method in (args.methods if cp > 1 else ["allgather"]):
                r = run(args, data, seq, cp, method, args.steps)
                if cp == 1 and "error" not in r:
                    ref = r["activation_bytes_per_rank"]
                    r["method"] = "-"
                rows.append(r)
                block.append(r)
        if args.balance:
            for cp in [c for c in args.cp if c > 1]:
                r = run(args, data, seq, cp, "allgather", args.steps, balancer="none")
                r["method"] = "allg/none"
                rows.append(r)
                block.append(r)
        add_hidden(block)
        print(header)
        for r in block:
            print(fmt_row(r, ref))
    demo = []
    if args.long:
        limit = [f"--training.memory_limit_gib={args.budget_gib}"]
        print(f"\nseq {args.long}, budget {args.budget_gib} GiB per rank ([training] memory_limit_gib):")
        r1 = run(args, data, args.long, 1, "allgather", 1, limit)
        r1["method"] = "-"
        oom = [l for l in r1.get("error", "").splitlines() if "out of memory" in l]
        if oom:
            r1["error"] = oom[0].strip()
        print(f"  cp 1: {oom[0].strip() if oom else r1.get('error', 'trained: the budget is too large to demonstrate')}")
        demo.append(r1)
        for method in args.long_methods:
            r = run(args, data, args.long, 4, method, 1, limit)
            demo.append(r)
            print("  " + fmt_row(r, None))
    write_result(args.json, {"layers": args.layers, "steps": args.steps, "rows": rows, "long": args.long,
                             "budget_gib": args.budget_gib, "demonstration": demo})
    print(f"wrote {args.json}")
    failed = [r for r in rows if "error" in r] + [r for r in demo[1:] if "error" in r]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
