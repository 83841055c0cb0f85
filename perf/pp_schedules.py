#!/usr/bin/env python3
"""perf/pp_schedules: pipeline schedules measured on CPU ranks against their unit-cost simulation and
the papers' bubble formulas. For each schedule (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble,
ZBVZeroBubble) at pp 2 and 4 and m = 4, 8, 16 micro-batches of one sample (where the schedule's
rules allow m), it trains the debug model (inputs/llama3_debug.toml, 6 blocks) on pp ranks and reads
metrics.jsonl's pipeline record of each step after the first:

  idle      = pp_recv_wait_s_per_pp_rank / step_time_s, per pp rank: the fraction of the step the
              rank waited in pipeline receives (bubble plus transfer), averaged over steps;
  idle/busy = idle / (1 - idle), the quantity the simulation and the formulas give;
  act peak  = activation_peak_bytes_per_pp_rank: the allocator's peak of the activations category
              (saved tensors and messages) on each pp rank.

Next to them: `meshtrain pp schedule`'s simulation of the same list (F = 1, B = 2, I = W = 1): each
rank's idle / busy, the textbook bubble (GPipe / 1F1B (pp - 1) / m, Interleaved1F1B
(pp - 1) / (v m), ZB-H1 (pp - 1) / (3 v m), ZB-V (pp - 1) / (6 m)), and each rank's peak in-flight
micro-batches (forwards whose B, or W when split, has not run; per stage). Activation memory should follow
the in-flight count: act peak / in-flight (bytes per in-flight stage micro-batch) is printed too.

One OpenMP / BLAS thread per rank. On a machine with fewer cores than pp ranks (pp 4 on 2 cores)
the ranks share cores, so a rank also waits while its neighbour computes on the core it needs; the
pp 2 rows are the meaningful ones there. A benchmark, not a test: nothing asserts on time.

usage: /usr/bin/python3 perf/pp_schedules.py [--pp 2 4] [--microbatches 4 8 16]
           [--schedules GPipe 1F1B ...] [--steps 8] [--seq-len 128] [--data H5] [--out DIR]
           [--json PATH] [--binary build/bin/meshtrain]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.dont_write_bytecode = True  # no perf/__pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_volume import ROOT, add_run_arguments, ensure_data, record_failure, train, write_result  # noqa: E402

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


def simulate(binary, schedule, pp, m):
    """`meshtrain pp schedule`'s simulation: {idle_over_busy: [pp], formula, formula_text,
    simulated, in_flight: [pp]}, or None when the schedule's rules refuse (pp, m)."""
    res = subprocess.run([binary, "pp", "schedule", "--schedule", schedule, "--pp", str(pp), "--microbatches", str(m)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        return None
    out = res.stdout
    rows = [l for l in out.splitlines() if re.match(r"^rank \d+ ", l)]
    cells = [l.split()[2:] for l in rows]  # "rank", "r", then one cell per unit slot
    makespan = max(len(c) for c in cells)
    idle = [c.count(".") + makespan - len(c) for c in cells]  # trailing idle slots are trimmed
    ratio = [i / (makespan - i) for i in idle]
    sim = re.search(r"simulated ([0-9.]+), (.+) = ([0-9.]+)", out)
    flight = re.search(r"peak in-flight micro-batches per rank[^:]*: ([0-9 ]+)", out)
    return {"idle_over_busy": ratio, "simulated": float(sim.group(1)), "formula_text": sim.group(2),
            "formula": float(sim.group(3)), "in_flight": [int(x) for x in flight.group(1).split()]}


def pipeline_records(folder):
    """The pipeline records of metrics.jsonl (one per logged step), by step."""
    recs = [json.loads(l) for l in open(os.path.join(folder, "metrics.jsonl")) if l.strip()]
    return {r["step"]: r for r in recs if "pp_recv_wait_s_per_pp_rank" in r}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    p.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    p.add_argument("--steps", type=int, default=8, help="steps per run (>= 2); the first is not averaged")
    p.add_argument("--seq-len", type=int, default=128)
    add_run_arguments(p, "pp_schedules")
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be >= 2")
    deck = os.path.join(ROOT, "inputs/llama3_debug.toml")
    data = ensure_data(args.data, args.out, args.binary, ndocs=200, vocab=2048)
    runs, failed = [], False
    for pp in args.pp:
        for schedule in args.schedules:
            for m in args.microbatches:
                sim = simulate(args.binary, schedule, pp, m)
                if sim is None:
                    print(f"skipping {schedule} pp {pp} m {m}: the schedule's rules refuse it", flush=True)
                    continue
                tag = f"{schedule}-pp{pp}-m{m}"
                over = [f"--parallelism.pipeline_parallel_degree={pp}",
                        f"--parallelism.pipeline_parallel_schedule={schedule}",
                        "--parallelism.data_parallel_shard_degree=1", "--parallelism.data_parallel_replicate_degree=1",
                        f"--training.local_batch_size={m}", f"--training.global_batch_size={m}",
                        f"--training.seq_len={args.seq_len}", f"--training.steps={args.steps}",
                        "--checkpoint.enable=false"]
                print(f"running {tag}", flush=True)
                out = os.path.join(args.out, tag)
                recs, _, err = train(args.binary, deck, data, out, pp, over, timeout=args.timeout)
                run = {"schedule": schedule, "pp": pp, "microbatches": m, "simulation": sim, "overrides": over}
                if err:
                    record_failure(runs, run, err)
                    failed = True
                    continue
                pipe = pipeline_records(out)
                steps = [r for r in recs if r["step"] > 1 and r["step"] in pipe]
                idle = [statistics.fmean(pipe[r["step"]]["pp_recv_wait_s_per_pp_rank"][k] / r["step_time_s"]
                                         for r in steps) for k in range(pp)]
                act = [max(pipe[r["step"]]["activation_peak_bytes_per_pp_rank"][k] for r in steps) for k in range(pp)]
                run.update({"step_time_s": statistics.fmean(r["step_time_s"] for r in steps), "idle": idle,
                            "idle_over_busy": [i / (1 - i) for i in idle], "activation_peak_bytes": act,
                            "bytes_per_in_flight": [a / f for a, f in zip(act, sim["in_flight"])]})
                runs.append(run)

    print()
    hdr = (f"{'schedule':22} {'pp':>2} {'m':>3} {'step s':>7}  {'idle/busy measured (per rank)':31} "
           f"{'simulated':23} {'formula':>7}  {'in-flight':10} {'act peak MiB':23} {'MiB / in-flight':20}")
    print(hdr)
    print("-" * len(hdr))
    fmt = lambda xs, f: " ".join(f.format(x) for x in xs)  # noqa: E731
    for r in runs:
        if "error" in r:
            print(f"{r['schedule']:22} {r['pp']:2} {r['microbatches']:3} run error: {r['error'].splitlines()[0]}")
            continue
        s = r["simulation"]
        print(f"{r['schedule']:22} {r['pp']:2} {r['microbatches']:3} {r['step_time_s']:7.3f}  "
              f"{fmt(r['idle_over_busy'], '{:.3f}'):31} {fmt(s['idle_over_busy'], '{:.3f}'):23} {s['formula']:7.3f}  "
              f"{fmt(s['in_flight'], '{}'):10} {fmt([a / 2**20 for a in r['activation_peak_bytes']], '{:.1f}'):23} "
              f"{fmt([b / 2**20 for b in r['bytes_per_in_flight']], '{:.2f}'):20}")
    write_result(args.json, {"steps": args.steps, "seq_len": args.seq_len, "runs": runs, "all_ran": not failed})
    print(f"\nwrote {args.json}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
