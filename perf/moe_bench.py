#!/usr/bin/env python3
"""perf/moe_bench: a Mixture-of-Experts model against the dense model with the same active
parameters, on CPU ranks, at expert-parallel degrees 1, 2 and 4.

Models (the Llama 3 debug deck's attention: dim 256, 16 heads; --layers blocks; seq_len --seq):
  - dense: a SwiGLU FFN of width top_k x --expert-width in every block;
  - moe:   --experts routed experts of width --expert-width, top_k of them per token, in every
           block (same active FFN parameters as dense, plus the router's E x D).
Every layout is FSDP over its ranks (dp_shard = ranks); ep > 1 borrows ep of them. For each run
it reports, from metrics.jsonl:
  - tokens/s per rank (median over the steps after the first two) and the step time;
  - the share of the step spent in the ep token exchange (moe_dispatch_s / step_time_s; 0 at
    ep 1, where the dispatch is a local gather);
  - rank 0's parameter shard bytes, routed experts apart from the rest (the summary record), and
    the allocator's peak per rank.
With --balanced the router is bypassed ([debug] moe_force_load_balance) so every expert gets the
same load; otherwise the routing is learned (the first steps are imbalanced).

Ranks run one OpenMP thread each; 4 ranks on a 2-core machine are oversubscribed, so per-rank
rates at 4 ranks carry that (the table prints the core count).

usage: /usr/bin/python3 perf/moe_bench.py [--layers 2] [--seq 256] [--experts 8] [--top-k 2]
           [--expert-width 256] [--steps 6] [--balanced] [--data H5] [--out DIR] [--json PATH]
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


def summary_and_moe(out):
    """(summary record, MoE records) of a run folder's metrics.jsonl."""
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    summary = next((r for r in recs if r.get("event") == "summary"), {})
    return summary, [r for r in recs if "moe_layers" in r]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-width", type=int, default=256)
    p.add_argument("--local-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--balanced", action="store_true")
    add_run_arguments(p, "moe_bench")
    a = p.parse_args()
    if a.steps < 4:
        p.error("--steps must be >= 4 (the first two are not timed)")
    data = ensure_data(a.data, a.out, a.binary, ndocs=150)
    common = [f"--model.n_layers={a.layers}", "--model.vocab_size=512", f"--training.seq_len={a.seq}",
              f"--training.local_batch_size={a.local_batch}", f"--training.steps={a.steps}",
              "--lr_scheduler.warmup_steps=1", "--job.final_dump=false", "--metrics.moe_histogram_freq=0"]
    dense = [f"--model.ffn_hidden_dim={a.top_k * a.expert_width}"]
    moe = [f"--model.num_experts={a.experts}", f"--model.top_k={a.top_k}", f"--model.moe_inter_dim={a.expert_width}"]
    if a.balanced:
        moe.append("--debug.moe_force_load_balance=true")
    runs = [("dense", 2, 1, dense), ("moe", 2, 1, moe), ("moe", 2, 2, moe),
            ("dense", 4, 1, dense), ("moe", 4, 1, moe), ("moe", 4, 2, moe), ("moe", 4, 4, moe)]
    rows = []
    for model, n, ep, over in runs:
        tag = f"{model}-np{n}-ep{ep}"
        args = common + over + [f"--parallelism.data_parallel_shard_degree={n}",
                                f"--training.global_batch_size={a.local_batch * n}",
                                f"--parallelism.expert_parallel_degree={ep}"]
        print(f"running {tag}", flush=True)
        recs, _, err = train(a.binary, DECK, data, os.path.join(a.out, tag), n, args, timeout=a.timeout)
        if err:
            rows.append({"run": tag, "error": err})
            print(err)
            continue
        timed = recs[2:]
        summary, moe_recs = summary_and_moe(os.path.join(a.out, tag))
        step_s = statistics.median(r["step_time_s"] for r in timed)
        dispatch = [r.get("moe_dispatch_s", 0.0) for r in moe_recs[2:]]
        rows.append({
            "run": tag, "model": model, "ranks": n, "ep": ep,
            "tokens_per_s_per_rank": statistics.median(r["tokens_per_s_per_rank"] for r in timed),
            "step_time_s": step_s,
            "dispatch_share": (statistics.median(dispatch) / step_s) if dispatch and step_s > 0 else 0.0,
            "parameters": summary.get("parameters"),
            "expert_param_bytes_rank0": summary.get("expert_parameter_bytes_rank0"),
            "other_param_bytes_rank0": summary.get("nonexpert_parameter_bytes_rank0"),
            "memory_peak_bytes": max(r["memory_peak_bytes"] for r in timed),
            "max_over_mean_load": statistics.median(r["moe_max_over_mean"] for r in moe_recs[2:]) if moe_recs else None,
        })
    print(f"\n{a.layers} blocks, seq_len {a.seq}, micro-batch {a.local_batch}; moe: {a.experts} experts of "
          f"{a.expert_width}, top-{a.top_k}{' (balanced routing)' if a.balanced else ''}; dense FFN "
          f"{a.top_k * a.expert_width}; {machine()}\n")
    hdr = (f"{'run':15} {'tok/s/rank':>10} {'step s':>7} {'dispatch':>8} {'experts MiB':>11} {'rest MiB':>8} "
           f"{'peak MiB':>8} {'max/mean':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "error" in r:
            print(f"{r['run']:15} error")
            continue
        mib = lambda b: f"{b / 2**20:.2f}" if b is not None else "-"  # noqa: E731
        load = f"{r['max_over_mean_load']:.2f}" if r["max_over_mean_load"] is not None else "-"
        print(f"{r['run']:15} {r['tokens_per_s_per_rank']:10.0f} {r['step_time_s']:7.3f} {100 * r['dispatch_share']:7.1f}% "
              f"{mib(r['expert_param_bytes_rank0']):>11} {mib(r['other_param_bytes_rank0']):>8} "
              f"{mib(r['memory_peak_bytes']):>8} {load:>8}")
    write_result(a.json, {"machine": machine(), "layers": a.layers, "seq_len": a.seq, "experts": a.experts, "top_k": a.top_k,
                          "expert_width": a.expert_width, "balanced": a.balanced, "rows": rows})
    print(f"\nwrote {a.json}")
    sys.exit(1 if any("error" in r for r in rows) else 0)


if __name__ == "__main__":
    main()
