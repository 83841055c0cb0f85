#!/usr/bin/env python3
"""perf/cpu_step_bench: median training-step time and tokens/s of the debug model on this
machine's cores, for meshtrain (1 rank, N OpenMP/BLAS threads) and for the equivalent PyTorch
model (perf/torch_step.py, same shape, batch, sequence length and thread count), measured in the
same run; prints the ratio and writes JSON. A benchmark, not a test: nothing here asserts on time.

usage: /usr/bin/python3 perf/cpu_step_bench.py [--threads N] [--steps S] [--data H5] [--out DIR]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, env=None):
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res.stdout


def ensure_data(args, binary):
    if os.path.exists(args.data):
        return args.data
    corpus = os.path.join(args.out, "corpus")
    data = os.path.join(args.out, "bench.h5")
    if not os.path.exists(data):
        sh([os.path.join(ROOT, "tests/fixtures/make_corpus.sh"), corpus, "400"])
        sh([binary, "data", "prepare", "--input", corpus, "--output", data, "--vocab-size", "2048"])
    return data


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--deck", default=os.path.join(ROOT, "inputs/llama3_debug.toml"))
    p.add_argument("--data", default=os.path.join(ROOT, "data/brown.h5"))
    p.add_argument("--out", default=os.path.join(ROOT, "perf/out"))
    p.add_argument("--binary", default=os.path.join(ROOT, "build/bin/meshtrain"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data = ensure_data(args, args.binary)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))

    dump = os.path.join(args.out, "meshtrain_run")
    sh(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", "--bind-to", "none", args.binary, "train",
        "--deck", args.deck, f"--training.dataset={data}", f"--job.dump_folder={dump}",
        f"--training.steps={args.steps}", f"--training.local_batch_size={args.batch}",
        f"--training.global_batch_size={args.batch}", f"--training.seq_len={args.seq_len}",
        "--metrics.log_freq=1", "--validation.enable=false"], env=env)
    recs = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
    mt_times = [r["step_time_s"] for r in recs if "step_time_s" in r][args.warmup:]
    mt_step = statistics.median(mt_times)
    shape = json.loads(sh([args.binary, "model", "info", "--deck", args.deck, "--seq-len", str(args.seq_len), "--json"]))

    torch_json = os.path.join(args.out, "torch_step.json")
    sh(["/usr/bin/python3", os.path.join(ROOT, "perf/torch_step.py"), "--dim", str(shape["dim"]),
        "--n-layers", str(shape["n_layers"]), "--n-heads", str(shape["n_heads"]),
        "--n-kv-heads", str(shape["n_kv_heads"]), "--vocab", str(shape["vocab_size"]),
        "--ffn-dim", str(shape["ffn_dim"]), "--seq-len", str(args.seq_len), "--batch", str(args.batch),
        "--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--json", torch_json], env=env)
    torch_res = json.load(open(torch_json))
    tokens = args.batch * args.seq_len
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "threads": args.threads, "batch": args.batch, "seq_len": args.seq_len, "model": shape,
        "meshtrain_step_s": mt_step, "meshtrain_tokens_per_s": tokens / mt_step,
        "torch_step_s": torch_res["median_step_s"], "torch_tokens_per_s": tokens / torch_res["median_step_s"],
    }
    result["ratio"] = result["meshtrain_tokens_per_s"] / result["torch_tokens_per_s"]
    print(f"{'':12} {'step (s)':>10} {'tokens/s':>10}")
    print(f"{'meshtrain':12} {mt_step:10.4f} {result['meshtrain_tokens_per_s']:10.0f}")
    print(f"{'pytorch':12} {result['torch_step_s']:10.4f} {result['torch_tokens_per_s']:10.0f}")
    print(f"ratio meshtrain / pytorch tokens/s: {result['ratio']:.2f}x  ({args.threads} threads, "
          f"batch {args.batch} x {args.seq_len})")
    with open(os.path.join(args.out, "cpu_step_bench.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
