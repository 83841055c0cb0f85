#!/usr/bin/env python3
"""perf/block_causal_bench: training-step time with document masking (`[model] attn_mask_type =
"block_causal"`) against plain causal attention, same model, data, batch and sequence length,
measured in the same run on this machine's CPU, one rank; prints the ratios and writes JSON.

The model is a Llama 3 shape small enough that a step at 32k tokens runs in tens of seconds on a
few cores (default dim 64, 1 layer, 4 heads of 16: attention dominates the step at these lengths,
which is what the comparison is about). The data is the Brown corpus (`make corpus`: documents of
~3,600 tokens at vocabulary 2048). Beside the times the script prints the attention work that
document masking leaves, from the token store itself: over every window of seq_len inputs of the
training split, Σ_d L_d(L_d + 1)/2 over the window's document pieces divided by T(T + 1)/2 (the
causal count), i.e. the share of causal score/value products the block-causal kernels compute.

FLOPs and MFU: meshtrain counts attention as TorchTitan does whatever the mask
(12·L·H·Dh·T per token, ModelArgs::flops_per_token), so the MFU printed by both runs uses the
same FLOPs per token and the block_causal run's counted FLOP/s rise by exactly its step-time gain
(its MFU too on GPUs; on CPUs each run measures its own sgemm peak, so MFU only compares within a
run); the "performed" columns count the products the kernels compute instead (the causal half of
the attention term, times the work share above under the mask).

A benchmark, not a test: nothing here asserts on time. Take the build lock around it when the
numbers are to be reported (other agents share the machine):
  flock /tmp/meshtrain-build.lock /usr/bin/python3 perf/block_causal_bench.py

usage: /usr/bin/python3 perf/block_causal_bench.py [--seq-lens 8192,32768] [--threads N] [--out DIR]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

from cpu_step_bench import ROOT, sh  # noqa: E402  (perf/ is the script's folder)


def attention_share(data, seq_len):
    """Mean over the training split's consecutive windows of seq_len inputs of the block-causal
    attention work relative to causal: Σ L(L+1)/2 over the window's document pieces (a document
    ends with, and includes, its EOS token) over T(T+1)/2. Also the mean pieces per window."""
    import h5py
    import numpy as np
    with h5py.File(data, "r") as f:
        eos = int(f.attrs["eos_id"])
        tokens = np.asarray(f["train/tokens"][:])
    n_win = (len(tokens) - 1) // seq_len
    causal = seq_len * (seq_len + 1) / 2
    shares, pieces = [], []
    for w in range(n_win):
        x = tokens[w * seq_len:(w + 1) * seq_len]
        # Position p starts a document when p = 0 or input p - 1 is EOS.
        starts = np.concatenate(([0], np.nonzero(x[:-1] == eos)[0] + 1, [seq_len]))
        lens = np.diff(starts).astype(np.float64)
        shares.append(float((lens * (lens + 1) / 2).sum() / causal))
        pieces.append(len(lens))
    return statistics.mean(shares), statistics.mean(pieces), n_win


def run(args, data, env, seq_len, mask, steps):
    dump = os.path.join(args.out, f"block_causal_bench_{mask}_{seq_len}")
    sh(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", "--bind-to", "none", args.binary, "train",
        "--deck", args.deck, f"--training.dataset={data}", f"--job.dump_folder={dump}",
        f"--training.steps={steps}", f"--training.local_batch_size={args.batch}",
        f"--training.global_batch_size={args.batch}", f"--training.seq_len={seq_len}",
        f"--model.dim={args.dim}", f"--model.n_layers={args.n_layers}", f"--model.n_heads={args.n_heads}",
        f"--model.n_kv_heads={args.n_heads}", f"--model.attn_mask_type={mask}",
        "--metrics.log_freq=1", "--validation.enable=false", "--checkpoint.enable=false"], env=env)
    recs = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
    times = [r["step_time_s"] for r in recs if "step_time_s" in r]

    def med(key):  # the first step also pays one-time setup
        v = [r[key] for r in recs if key in r]
        return statistics.median(v[1:] if len(v) > 1 else v)
    return {"steps": times, "median_step_s": med("step_time_s"), "mfu": med("mfu"),
            "tflops": med("tflops_per_rank"), "tokens_per_s": med("tokens_per_s")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, typ, default in (
            ("--seq-lens", str, "8192,32768"), ("--threads", int, os.cpu_count()),
            ("--steps", str, "3,2"),  # steps per run, one per seq len; the first is not timed
            ("--batch", int, 1), ("--dim", int, 64), ("--n-layers", int, 1), ("--n-heads", int, 4),
            ("--deck", str, os.path.join(ROOT, "inputs/llama3_debug.toml")),
            ("--data", str, os.path.join(ROOT, "data/brown.h5")), ("--out", str, os.path.join(ROOT, "perf/out")),
            ("--binary", str, os.path.join(ROOT, "build/bin/meshtrain"))):
        p.add_argument(name, type=typ, default=default)
    args = p.parse_args()
    if not os.path.exists(args.data):
        sys.exit(f"{args.data}: no token store (make corpus builds data/brown.h5)")
    os.makedirs(args.out, exist_ok=True)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    steps = [int(s) for s in args.steps.split(",")]
    steps += [steps[-1]] * (len(seq_lens) - len(steps))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))

    rows = []
    for seq_len, n in zip(seq_lens, steps):
        share, pieces, n_win = attention_share(args.data, seq_len)
        res = {m: run(args, args.data, env, seq_len, m, n) for m in ("causal", "block_causal")}
        rows.append({"seq_len": seq_len, "steps": n, "attention_share": share, "pieces_per_window": pieces,
                     "windows": n_win, "causal": res["causal"], "block_causal": res["block_causal"],
                     "speedup": res["causal"]["median_step_s"] / res["block_causal"]["median_step_s"]})
        # Attention products performed per token: the counted 12·L·dim·T times the causal half
        # ((T + 1) / 2T) and, under the mask, the work share.
        counted_attn = 12 * args.n_layers * args.dim * seq_len
        for m, w in (("causal", 1.0), ("block_causal", share)):
            r = res[m]
            fpt = r["tflops"] * 1e12 / r["tokens_per_s"]
            r["counted_flops_per_token"] = fpt
            r["performed_flops_per_token"] = fpt - counted_attn * (1 - w * (seq_len + 1) / (2 * seq_len))
            r["performed_tflops"] = r["performed_flops_per_token"] * r["tokens_per_s"] / 1e12

    print(f"model: llama3 dim {args.dim}, {args.n_layers} layer(s), {args.n_heads} heads of "
          f"{args.dim // args.n_heads}, vocabulary 2048; batch {args.batch}; {args.threads} threads; "
          f"data {os.path.relpath(args.data, ROOT)}")
    print(f"{'seq_len':>8} {'docs/window':>11} {'attn work':>9} {'causal (s)':>10} {'block (s)':>10} "
          f"{'speedup':>8} {'GFLOP/s counted c / b':>22} {'GFLOP/s performed c / b':>24}")
    for r in rows:
        c, b = r["causal"], r["block_causal"]
        print(f"{r['seq_len']:8d} {r['pieces_per_window']:11.2f} {100 * r['attention_share']:8.1f}% "
              f"{c['median_step_s']:10.3f} {b['median_step_s']:10.3f} {r['speedup']:7.2f}x "
              f"{1e3 * c['tflops']:10.2f} / {1e3 * b['tflops']:9.2f} "
              f"{1e3 * c['performed_tflops']:11.2f} / {1e3 * b['performed_tflops']:10.2f}")
    print("attn work: block-causal score/value products as a share of causal ones (Brown windows); counted: "
          "FLOPs as meshtrain's MFU counts them (attention as TorchTitan does, mask ignored); performed: FLOPs "
          "the kernels compute (causal half, document share). MFU itself is in the JSON; on CPUs its peak is an "
          "sgemm rate measured by each run, so it only compares within a run")
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "threads": args.threads, "batch": args.batch, "dim": args.dim, "n_layers": args.n_layers,
        "n_heads": args.n_heads, "rows": rows,
    }
    with open(os.path.join(args.out, "block_causal_bench.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
