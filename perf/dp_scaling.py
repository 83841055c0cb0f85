#!/usr/bin/env python3
"""perf/dp_scaling: weak scaling of the data-parallel layouts: tokens/s per rank of the debug
model (inputs/llama3_debug.toml) and of a wider model (dim 512, 8 heads) under DDP, FSDP (ZeRO-3),
HSDP (2 x N/2) and TP 2 x FSDP N/2 at 1, 2, 4 and 8 ranks (the local batch fixed, the global
batch = local x dp, dp = ranks / tp), with the mean tokens/s per rank over the steps after the first, the ratio to one rank,
and the fraction of step time rank 0 spends blocked on gradient / parameter collectives
(mean comm_wait_s / mean step_time_s; tensor-parallel collectives are inside the layers and not
part of it). One OpenMP/BLAS thread per rank. A benchmark, not a test:
nothing here asserts on time. On a machine with fewer cores than ranks the ranks are
oversubscribed, so per-rank throughput drops with the rank count for that reason alone.

usage: /usr/bin/python3 perf/dp_scaling.py [--quick] [--ranks 1 2 4 8] [--models debug wide]
           [--layouts ddp fsdp hsdp tp2] [--steps S] [--local-batch B] [--seq-len T] [--threads N]
           [--data H5] [--out DIR] [--json PATH] [--binary build/bin/meshtrain]
  --quick: 4 steps, local batch 2, seq_len 64 (a few minutes on 2 cores)
"""
import argparse
import os
import statistics
import sys

sys.dont_write_bytecode = True  # no perf/__pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_volume import ROOT, add_run_arguments, ensure_data, model_shape, record_failure, train, write_result  # noqa: E402

MODELS = {
    "debug": [],
    "wide": ["--model.dim=512", "--model.n_heads=8", "--model.n_kv_heads=8"],
}
LAYOUTS = ("ddp", "fsdp", "hsdp", "tp2")


def degrees(layout, n):
    """(dp_replicate, dp_shard, extra overrides) or None when the layout does not exist at n ranks."""
    if n == 1:
        return (1, 1, []) if layout == "single" else None
    if layout == "ddp":
        return n, 1, []
    if layout == "fsdp":
        return 1, n, ["--parallelism.zero_stage=3"]
    if layout == "hsdp":
        return (2, n // 2, ["--parallelism.zero_stage=3"]) if n % 2 == 0 and n >= 4 else None
    if layout == "tp2":  # TP 2 inside, FSDP over the other ranks (DDP-free: dp_shard = n / 2)
        return (1, n // 2, ["--parallelism.tensor_parallel_degree=2"]) if n % 2 == 0 else None
    return None


def mean(xs):
    return statistics.fmean(xs) if xs else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 steps, local batch 2, seq_len 64")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--steps", type=int, help="steps per run (default 6, --quick 4); the first is not averaged")
    p.add_argument("--local-batch", type=int, help="samples per rank (default 4, --quick 2)")
    p.add_argument("--seq-len", type=int, help="tokens per sample (default 128, --quick 64)")
    p.add_argument("--threads", type=int, default=1, help="OpenMP/BLAS threads per rank")
    p.add_argument("--deck", default=os.path.join(ROOT, "inputs/llama3_debug.toml"))
    add_run_arguments(p, "dp_scaling")
    args = p.parse_args()
    steps = args.steps or (4 if args.quick else 6)
    lbs = args.local_batch or (2 if args.quick else 4)
    seq = args.seq_len or (64 if args.quick else 128)
    if steps < 2:
        p.error("--steps must be >= 2 (the first step is not averaged)")
    os.makedirs(args.out, exist_ok=True)
    data = ensure_data(args.data, args.out, args.binary)

    rows, failed = [], False
    for model in args.models:
        base = None
        shape = None
        for n in sorted(args.ranks):
            for layout in (["single"] if n == 1 else list(args.layouts)):
                d = degrees(layout, n)
                if d is None:
                    continue
                R, S, extra = d
                over = MODELS[model] + extra + [
                    f"--parallelism.data_parallel_replicate_degree={R}", f"--parallelism.data_parallel_shard_degree={S}",
                    f"--training.local_batch_size={lbs}", f"--training.global_batch_size={lbs * R * S}",
                    f"--training.seq_len={seq}", f"--training.steps={steps}"]
                tag = f"{model}-{layout}-np{n}"
                out = os.path.join(args.out, tag)
                print(f"running {tag}: {' '.join(over)}", flush=True)
                recs, summary, err = train(args.binary, args.deck, data, out, n, over, threads=args.threads,
                                           timeout=args.timeout)
                row = {"model": model, "layout": layout, "ranks": n, "dp_replicate": R, "dp_shard": S}
                if err:
                    record_failure(rows, row, err)
                    failed = True
                    continue
                if shape is None:
                    shape = model_shape(args.binary, os.path.join(out, "deck.resolved.toml"))
                tail = recs[1:] or recs
                tps = mean([r["tokens_per_s_per_rank"] for r in tail if "tokens_per_s_per_rank" in r])
                step_t = mean([r["step_time_s"] for r in tail if "step_time_s" in r])
                waits = [r["comm_wait_s"] for r in tail if "comm_wait_s" in r]
                wait = mean(waits)
                peak = max((r.get("memory_peak_bytes", 0) for r in recs), default=0)
                row.update({"steps_averaged": len(tail), "tokens_per_s_per_rank": tps, "step_time_s": step_t,
                            "comm_wait_s": wait,
                            "comm_wait_fraction": (wait / step_t) if wait is not None and step_t else None,
                            "memory_peak_bytes": peak,
                            "memory_peak_bytes_by_category": (summary or {}).get("memory_peak_bytes_by_category"),
                            "loss_first": recs[0].get("loss"), "loss_last": recs[-1].get("loss")})
                if layout == "single":
                    base = tps
                row["vs_1_rank"] = (tps / base) if base and tps else None
                rows.append(row)
        for r in rows:
            if r["model"] == model:
                r["model_shape"] = shape

    hdr = f"{'model':6} {'layout':7} {'ranks':>5} {'tokens/s/rank':>13} {'vs 1 rank':>9} {'step s':>8} " \
          f"{'comm wait':>9} {'peak MiB':>9}"
    print(f"\nweak scaling: local batch {lbs} x seq_len {seq}, {steps} steps (mean over steps 2..{steps}), "
          f"{args.threads} thread(s) per rank, {os.cpu_count()} cores")
    for model in args.models:
        s = next((r.get("model_shape") for r in rows if r["model"] == model and r.get("model_shape")), None)
        if s:
            print(f"  {model}: dim {s['dim']}, {s['n_layers']} layers, {s['n_heads']} heads, "
                  f"{s['n_kv_heads']} kv heads, ffn {s['ffn_dim']}, vocab {s['vocab_size']}, "
                  f"{s['parameters'] / 1e6:.2f} M parameters")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:6} {r['layout']:7} {r['ranks']:5} FAILED: {r['error'].splitlines()[0]}")
            continue
        f = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
        wait = f"{100 * r['comm_wait_fraction']:.1f}%" if r["comm_wait_fraction"] is not None else "-"
        print(f"{r['model']:6} {r['layout']:7} {r['ranks']:5} {f(r['tokens_per_s_per_rank'], '13.1f')} "
              f"{f(r['vs_1_rank'], '9.2f')} {f(r['step_time_s'], '8.3f')} {wait:>9} "
              f"{r['memory_peak_bytes'] / 2**20:9.1f}")
    write_result(args.json, {"steps": steps, "local_batch_size": lbs, "seq_len": seq, "threads_per_rank": args.threads,
                             "quick": args.quick, "rows": rows})
    print(f"\nwrote {args.json}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
