#!/usr/bin/env python3
"""perf/gpu_step_bench: meshtrain against PyTorch on one GPU — the Llama 3.2 1B shape (dim 2048,
16 layers, 32 heads, 8 kv heads, FFN 8192, vocabulary 128256, tied embeddings) at seq_len 2048,
bf16 compute with float32 master weights and AdamW state, in the same run.

1. Deck: inputs/llama3_1b_gpu.toml with this run's overrides written into a temporary copy
   (OUT_DIR/deck.toml): the token store, validation and checkpoints off, a metric line per step,
   one rank; plus any `--section.key=value` given here (e.g. --activation_checkpoint.mode=full).
2. Token store: random tokens over the model's whole vocabulary in meshtrain's HDF5 format
   (doc/data-format.md), written with h5py; without h5py, tests/fixtures/make_corpus.sh +
   `meshtrain data prepare --vocab-size 2048` (ids < 2048; PyTorch draws from the same range;
   noted in the JSON). --data uses yours.
3. meshtrain: `meshtrain train` (through the bundle's meshtrain-run when --build is an unpacked
   bundle) probed for --search-steps steps at local batch 1, 2, 4, 8, ... until one fails with
   CUDA out of memory (the peak comes in the first step, once AdamW's state exists); then --steps
   steps at the largest batch that fit (or at --batch, without a search). From metrics.jsonl,
   skipping the first --warmup steps: median step_time_s, peak memory_peak_bytes, meshtrain's own
   tflops_per_rank and mfu.
4. Kernel time by kernel: one more short meshtrain run under `nsys profile` when nsys is found,
   `nsys stats --report cuda_gpu_kern_sum` as CSV, the top --top-kernels kernels by total time.
5. PyTorch: perf/torch_llama.py (validation/llama_reference.py's model: bf16 weight copies and
   activations, float32 masters and AdamW state, scaled_dot_product_attention, fused AdamW,
   clipping) eager and under torch.compile, each in its own process, at the same local batch
   (halved until it fits if PyTorch runs out of memory; the JSON says so), same steps and warm-up.

tokens/s = local batch × seq_len / median step time; TFLOPS = tokens/s × FLOPs per token, the
formula of meshtrain's metrics (`meshtrain model info --json`: 6·N_matmul +
12·layers·heads·head_dim·seq_len, the tied output projection counted; src/config/model_args.cpp); MFU = TFLOPS / --peak-tflops (989:
H100 and H200 SXM dense BF16 datasheet). Ratios are meshtrain / torch.compile and
meshtrain / eager tokens/s. On a GPU, each measured run (meshtrain's, PyTorch's) also records the
GPU's SM clock, power and clock-event reasons while it was busy (perf/gpu_clocks.py, nvidia-smi):
a step slower than its kernels' sum is either the host or the clocks, and this tells which.
A benchmark, not a test: nothing asserts on time. Every external step
that fails stops the run with its command and the end of its output.

usage: python3 perf/gpu_step_bench.py [--build build] [--out OUT.json] [--batch N] [--steps 20]
       [--warmup 5] [--peak-tflops 989] [--smoke] [--section.key=value ...]
--build: a build folder (bin/meshtrain) or an unpacked bundle (meshtrain-run, `make bundle`).
--smoke: a plumbing test for machines without a GPU: dim 64, 2 layers, vocabulary 512,
seq_len 64, meshtrain on device cpu in float32, PyTorch on CPU in float32; numbers meaningless.
Mixture of Experts: MoE overrides (e.g. --model.num_experts=8 --model.top_k=2
--model.moe_inter_dim=2048) bench meshtrain's MoE step (grouped GEMMs: one cuBLASLt GEMM per
expert) against validation/llama_reference.py's MoE (a PyTorch loop over experts with index_add,
the reference rather than a tuned kernel); `--smoke --model.num_experts=4 --model.moe_inter_dim=32`
checks the plumbing on CPU.
"""
import argparse
import csv
import datetime
import glob
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_clocks import GpuClockSampler, describe as describe_clocks  # noqa: E402

OOM_RE = re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED",
                    re.IGNORECASE)
SMOKE_OVERRIDES = ["--model.dim=64", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2",
                   "--model.vocab_size=512", "--training.seq_len=64", "--training.device=cpu",
                   "--training.mixed_precision_param=float32", "--training.mixed_precision_reduce=float32",
                   "--activation_checkpoint.mode=none"]


def die(msg):
    sys.exit(f"gpu_step_bench: {msg}")


def tail(text, n=25):
    return "\n".join(text.rstrip().splitlines()[-n:])


def run(cmd, log=None, env=None, timeout=None):
    """Runs cmd; returns (exit status, stdout + stderr). Writes the output to `log` if given."""
    try:
        res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=timeout)
        rc, out = res.returncode, res.stdout
    except FileNotFoundError as e:
        rc, out = 127, str(e)
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, out = 124, partial + f"\n(timed out after {timeout} s)"
    if log:
        with open(log, "w") as f:
            f.write(" ".join(shlex.quote(c) for c in cmd) + "\n" + out)
    return rc, out


def sh(cmd, what, **kw):
    rc, out = run(cmd, **kw)
    if rc != 0:
        die(f"{what} failed (exit {rc}):\n  {' '.join(shlex.quote(c) for c in cmd)}\n{tail(out)}")
    return out


# ---- the deck: base deck text with `section.key = value` overrides written in ----

def toml_literal(v):
    """A deck value: integers, floats and booleans as they are, anything else a quoted string."""
    if re.fullmatch(r"[-+]?\d+(\.\d*)?([eE][-+]?\d+)?|true|false", v) or v.startswith(("\"", "[")):
        return v
    return json.dumps(v)


def apply_overrides(text, overrides):
    """Deck text with each (section, key, value) set: the key's line replaced in its section, or
    appended to the section (created at the end when missing). The deck format is the TOML subset
    of doc/user-guide.md: [section] headers and `key = value` lines."""
    lines = text.splitlines()
    for section, key, value in overrides:
        line = f"{key} = {toml_literal(value)}"
        cur, sec_end, done = None, None, False
        for i, l in enumerate(lines):
            m = re.match(r"\s*\[([A-Za-z0-9_]+)\]\s*(#.*)?$", l)
            if m:
                if cur == section:
                    break
                cur = m.group(1)
                if cur == section:
                    sec_end = i + 1
                continue
            if cur == section:
                if re.match(rf"\s*{re.escape(key)}\s*=", l):
                    lines[i], done = line, True
                    break
                if l.strip():
                    sec_end = i + 1
        if done:
            continue
        if sec_end is None:
            lines += ["", f"[{section}]", line]
        else:
            lines.insert(sec_end, line)
    return "\n".join(lines) + "\n"


def deck_value(text, section, key):
    """The value of `key` in `[section]` of deck text (quotes and comment removed), or None."""
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*\[([A-Za-z0-9_]+)\]", line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(rf"\s*{re.escape(key)}\s*=\s*(\"[^\"]*\"|[^#\s]+)", line)
        if cur == section and m:
            return m.group(1).strip('"')
    return None


def parse_overrides(extra):
    out = []
    for a in extra:
        m = re.fullmatch(r"--([A-Za-z0-9_]+)\.([A-Za-z0-9_]+)=(.*)", a)
        if not m:
            die(f"unknown argument '{a}' (deck overrides are --section.key=value)")
        out.append(m.groups())
    return out


# ---- the token store ----

def write_random_store(path, vocab, seq_len, samples, seed=0):
    """meshtrain token store (doc/data-format.md) of uniform random ids in [0, vocab): `samples`
    training samples of seq_len + 1 tokens in 64 documents, 4 validation documents. Throughput
    depends on the shape only; the loader wraps around epochs, so a small store serves any run."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(seed)
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.attrs["format"] = "meshtrain-token-store"
        f.attrs["format_version"] = np.int64(1)
        f.attrs["vocab_size"] = np.int64(vocab)
        f.attrs["eos_id"] = np.int64(2)
        f.attrs["bos_id"] = np.int64(1)
        f.attrs["source"] = "perf/gpu_step_bench.py: uniform random token ids"
        for split, n_tok, n_doc in (("train", samples * seq_len + 1, 64), ("validation", 4 * seq_len + 1, 4)):
            g = f.create_group(split)
            g.create_dataset("tokens", data=rng.integers(0, vocab, n_tok, dtype=np.int64).astype(dtype))
            g.create_dataset("doc_offsets", data=np.linspace(0, n_tok, n_doc + 1).astype(np.uint64))
    os.replace(tmp, path)


def ensure_data(args, mt, out_dir, vocab, seq_len):
    """Returns (store path, vocabulary of its ids, how it was made)."""
    if args.data:
        if not os.path.exists(args.data):
            die(f"--data {args.data}: no such file")
        ids = vocab
        if importlib.util.find_spec("h5py"):
            import h5py
            with h5py.File(args.data, "r") as f:
                ids = min(vocab, int(f.attrs.get("vocab_size", vocab)))
        return args.data, ids, "given"
    path = os.path.join(out_dir, f"random_v{vocab}_t{seq_len}.h5")
    if not (importlib.util.find_spec("h5py") and importlib.util.find_spec("numpy")):
        pieces = min(vocab, 2048)
        corpus, path = os.path.join(out_dir, "corpus"), os.path.join(out_dir, f"corpus_v{pieces}.h5")
        if not os.path.exists(path):
            sh([os.path.join(ROOT, "tests/fixtures/make_corpus.sh"), corpus, "400"], "making a text corpus")
            sh(mt + ["data", "prepare", "--input", corpus, "--output", path, "--vocab-size", str(pieces)],
               "meshtrain data prepare")
        return path, pieces, f"make_corpus.sh + data prepare (no h5py: token ids < {pieces})"
    if not os.path.exists(path):
        write_random_store(path, vocab, seq_len, samples=256)
    return path, vocab, "uniform random ids (h5py)"


# ---- meshtrain ----

def meshtrain_command(build, launcher):
    """The command prefix that runs meshtrain: the bundle's launcher, or the build's binary."""
    if os.path.exists(os.path.join(build, "meshtrain-run")):
        return [os.path.join(build, "meshtrain-run"), "meshtrain"], "bundle"
    binary = os.path.join(build, "bin", "meshtrain")
    if not os.access(binary, os.X_OK):
        die(f"{binary} not found: pass --build with a CUDA build folder or an unpacked bundle (make bundle)")
    return shlex.split(launcher) + [binary], "build"


def timed_records(metrics_path, warmup):
    recs = []
    with open(metrics_path) as f:
        for line in f:
            r = json.loads(line)
            if "step_time_s" in r and r.get("step", 0) > warmup:
                recs.append(r)
    return recs


def meshtrain_trial(mt, deck, batch, steps, warmup, work, env, timeout=None, sample_clocks=False):
    """One `meshtrain train` at local batch `batch`: status ok / oom with the timed metrics (and,
    with sample_clocks, the GPU's clocks while it was busy: perf/gpu_clocks.py)."""
    name = f"meshtrain_b{batch}_s{steps}"
    dump = os.path.join(work, name)
    shutil.rmtree(dump, ignore_errors=True)
    os.makedirs(dump)
    log = os.path.join(work, name + ".log")
    cmd = mt + ["train", "--deck", deck, f"--training.local_batch_size={batch}",
                f"--training.global_batch_size={batch}", f"--training.steps={steps}", f"--job.dump_folder={dump}",
                "--job.final_dump=false"]
    with GpuClockSampler(sample_clocks) as clocks:
        rc, out = run(cmd, log=log, env=env, timeout=timeout)
    if rc == 124:
        die(f"meshtrain train at local batch {batch} did not finish in {timeout} s (--trial-timeout); log {log}")
    metrics = os.path.join(dump, "metrics.jsonl")
    if rc != 0:
        if OOM_RE.search(out):
            shutil.rmtree(dump, ignore_errors=True)
            return {"batch": batch, "status": "oom", "error": next(l for l in out.splitlines() if OOM_RE.search(l))[:400]}
        die(f"meshtrain train at local batch {batch} failed (exit {rc}), not out of memory; log {log}:\n{tail(out)}")
    recs = timed_records(metrics, warmup)
    if not recs:
        die(f"{metrics}: no training records after the {warmup} warm-up steps")
    summary = {}
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "summary":
                summary = r
    shutil.copy(metrics, os.path.join(work, name + ".metrics.jsonl"))
    shutil.rmtree(dump, ignore_errors=True)  # model_final.h5 of a 1B model is ~5 GB
    step = statistics.median(r["step_time_s"] for r in recs)
    return {"batch": batch, "status": "ok", "steps": steps, "median_step_s": step,
            "step_times_s": [r["step_time_s"] for r in recs],
            "memory_peak_bytes": max(r["memory_peak_bytes"] for r in recs),
            "meshtrain_tflops_per_rank": statistics.median(r["tflops_per_rank"] for r in recs),
            "meshtrain_mfu": statistics.median(r["mfu"] for r in recs),
            "loss_last": recs[-1]["loss"],
            "memory_peak_bytes_by_category": summary.get("memory_peak_bytes_by_category"),
            "gpu_clocks": clocks.summary()}


def find_nsys():
    found = shutil.which("nsys")
    if found:
        return found
    cands = sorted(glob.glob("/usr/local/cuda*/bin/nsys") + glob.glob("/opt/nvidia/nsight-systems/*/bin/nsys") +
                   glob.glob("/usr/local/cuda*/nsight-systems*/bin/nsys"))
    return cands[-1] if cands else None


def parse_kernel_csv(path, top):
    """Rows of nsys's cuda_gpu_kern_sum (or older gpukernsum) CSV, heaviest first:
    share of kernel time (%), total / average time (ns), instances, name."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if line.strip()))
    if not rows:
        return [], 0

    def norm(c):
        return re.sub(r"\s+", "", c or "").lower()
    columns = {norm(c): c for c in rows[0]}

    def col(*names):
        return next((columns[norm(n)] for n in names if norm(n) in columns), None)
    c_total = col("Total Time (ns)", "TotalTime(ns)", "Total Time")
    c_share = col("Time (%)", "Time(%)")
    c_inst = col("Instances", "Calls")
    c_avg = col("Avg (ns)", "Average (ns)", "Avg(ns)", "Average")
    c_name = col("Name")
    if not (c_total and c_name):
        raise ValueError(f"{path}: no 'Total Time (ns)' / 'Name' columns in {list(rows[0])}")
    num = lambda s: float(str(s).replace(",", "")) if s not in (None, "") else 0.0  # noqa: E731
    total_all = sum(num(r[c_total]) for r in rows)
    out = []
    for r in sorted(rows, key=lambda r: -num(r[c_total]))[:top]:
        t = num(r[c_total])
        out.append({"name": r[c_name], "share_pct": num(r[c_share]) if c_share else 100 * t / total_all,
                    "total_ns": t, "instances": int(num(r[c_inst])) if c_inst else None,
                    "avg_ns": num(r[c_avg]) if c_avg else None})
    return out, total_all


def nsys_kernels(args, mt, deck, batch, work, env):
    """Top kernels of a short meshtrain run under nsys, or {"skipped": why}."""
    nsys = find_nsys()
    if args.no_nsys:
        return {"skipped": "--no-nsys"}
    if not nsys:
        return {"skipped": "nsys not found (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-systems/*/bin)"}
    prefix = os.path.join(work, "nsys_meshtrain")
    dump = os.path.join(work, "meshtrain_nsys")
    shutil.rmtree(dump, ignore_errors=True)
    for old in glob.glob(prefix + "*"):
        os.remove(old)
    cmd = [nsys, "profile", "--trace=cuda", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
           "-o", prefix] + mt + ["train", "--deck", deck, f"--training.local_batch_size={batch}",
                                 f"--training.global_batch_size={batch}", f"--training.steps={args.profile_steps}",
                                 f"--job.dump_folder={dump}", "--job.final_dump=false"]
    sh(cmd, "nsys profile of meshtrain train", log=os.path.join(work, "nsys_profile.log"), env=env)
    shutil.rmtree(dump, ignore_errors=True)
    reps = glob.glob(prefix + ".nsys-rep") + glob.glob(prefix + ".qdrep")
    if not reps:
        die(f"nsys profile wrote no {prefix}.nsys-rep (log {work}/nsys_profile.log)")
    csv_path = None
    for report in ("cuda_gpu_kern_sum", "gpukernsum"):  # the name since nsys 2022.4, and before
        rc, out = run([nsys, "stats", "--report", report, "--format", "csv", "--force-export=true",
                       "--output", prefix, reps[0]], log=os.path.join(work, f"nsys_stats_{report}.log"))
        found = glob.glob(f"{prefix}*{report}*.csv")
        if rc == 0 and found:
            csv_path = found[0]
            break
    if not csv_path:
        die(f"nsys stats produced no kernel summary CSV (logs {work}/nsys_stats_*.log):\n{tail(out)}")
    kernels, total_ns = parse_kernel_csv(csv_path, args.top_kernels)
    return {"nsys": nsys, "report": reps[0], "csv": csv_path, "steps": args.profile_steps, "batch": batch,
            "kernel_time_total_s": total_ns / 1e9, "top": kernels,
            "note": "the whole run: start-up and the first steps included"}


# ---- PyTorch ----

def torch_run(args, mode, batch, model_json, data_vocab, work, torch_device, precision):
    out_json = os.path.join(work, f"torch_{mode}_b{batch}.json")
    cmd = [sys.executable, os.path.join(ROOT, "perf/torch_llama.py"), "--model-json", model_json,
           "--batch", str(batch), "--seq-len", str(args.seq_len), "--device", torch_device, "--mode", mode,
           "--precision", precision, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--data-vocab", str(data_vocab), "--json", out_json]
    if os.path.exists(out_json):
        os.remove(out_json)
    with GpuClockSampler(torch_device == "cuda") as clocks:
        rc, out = run(cmd, log=os.path.join(work, f"torch_{mode}_b{batch}.log"), timeout=args.trial_timeout)
    if rc == 124:
        return {"status": "error", "batch": batch, "error": f"did not finish in {args.trial_timeout} s (--trial-timeout)"}
    if rc != 0 or not os.path.exists(out_json):
        die(f"perf/torch_llama.py --mode {mode} failed (exit {rc}):\n  {' '.join(cmd)}\n{tail(out)}")
    with open(out_json) as f:
        r = json.load(f)
    r["gpu_clocks"] = clocks.summary()
    return r


def torch_best(args, mode, batch, model_json, data_vocab, work, torch_device, precision):
    """PyTorch at meshtrain's batch; on out of memory, halved until it fits (or 1 fails)."""
    tried = []
    while True:
        r = torch_run(args, mode, batch, model_json, data_vocab, work, torch_device, precision)
        tried.append({"batch": batch, "status": r["status"]})
        if r["status"] != "oom" or batch == 1:
            r["tried"] = tried
            return r
        batch //= 2


# ---- report ----

def gpu_info():
    if not shutil.which("nvidia-smi"):
        return None
    rc, out = run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    if rc != 0:
        return None
    first = out.strip().splitlines()[0] if out.strip() else ""
    parts = [p.strip() for p in first.split(",")]
    return dict(zip(["name", "memory_total", "driver"], parts)) if len(parts) == 3 else {"raw": first}


def rates(step_s, batch, seq_len, flops_per_token, peak_tflops):
    tok = batch * seq_len / step_s
    tflops = tok * flops_per_token / 1e12
    return {"tokens_per_s": tok, "tflops": tflops, "mfu": tflops / peak_tflops}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Any --section.key=value is written into the temporary deck.")
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="build folder (bin/meshtrain) or unpacked bundle (meshtrain-run)")
    p.add_argument("--deck", default=os.path.join(ROOT, "inputs/llama3_1b_gpu.toml"))
    p.add_argument("--out", help="JSON result (default OUT_DIR/gpu_step_bench.json)")
    p.add_argument("--work", help="folder for the deck, store, logs and metrics (default perf/out/gpu_bench)")
    p.add_argument("--data", help="an existing token store instead of the random one")
    p.add_argument("--batch", type=int, help="only this local batch (no search)")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--search-steps", type=int, default=3, help="steps of each batch-search probe")
    p.add_argument("--trial-timeout", type=int, default=1800, help="seconds per meshtrain or PyTorch run")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seq-len", type=int, help="default: the deck's (2048)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="per-GPU peak for MFU (989: H100 / H200 SXM dense BF16)")
    p.add_argument("--launcher", default="", help="prefix for the build's binary, e.g. 'mpirun -np 1'")
    p.add_argument("--profile-steps", type=int, default=6)
    p.add_argument("--top-kernels", type=int, default=15)
    p.add_argument("--no-nsys", action="store_true")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--smoke", action="store_true", help="CPU plumbing test (tiny model, no GPU)")
    args, extra = p.parse_known_args()
    overrides = parse_overrides((SMOKE_OVERRIDES if args.smoke else []) + extra)
    if args.search_steps < 2:
        die("--search-steps must be at least 2 (the first step is not timed)")
    if args.smoke:
        args.steps, args.warmup = min(args.steps, 6), min(args.warmup, 2)
        args.max_batch = min(args.max_batch, 4)
    if args.steps <= args.warmup:
        die(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    work = os.path.abspath(args.work or os.path.join(ROOT, "perf/out", "gpu_bench_smoke" if args.smoke else "gpu_bench"))
    os.makedirs(work, exist_ok=True)
    out_json = os.path.abspath(args.out or os.path.join(work, "gpu_step_bench.json"))
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    build = os.path.abspath(args.build)
    mt, mt_kind = meshtrain_command(build, args.launcher)
    env = dict(os.environ)

    # The deck: base + overrides, then the shape meshtrain will train (model info on that deck).
    if not os.path.exists(args.deck):
        die(f"{args.deck}: no such deck")
    with open(args.deck) as f:
        base = f.read()
    deck = os.path.join(work, "deck.toml")
    fixed = [("validation", "enable", "false"), ("checkpoint", "enable", "false"), ("metrics", "log_freq", "1"),
             ("parallelism", "data_parallel_replicate_degree", "1"), ("parallelism", "data_parallel_shard_degree", "-1"),
             ("parallelism", "tensor_parallel_degree", "1"), ("parallelism", "pipeline_parallel_degree", "1")]
    if args.seq_len:
        overrides.append(("training", "seq_len", str(args.seq_len)))
    with open(deck, "w") as f:
        f.write(apply_overrides(base, fixed + overrides))
    info = json.loads(sh(mt + ["model", "info", "--deck", deck, "--json"], "meshtrain model info").strip().splitlines()[-1])
    args.seq_len = info["seq_len"]
    model_json = os.path.join(work, "model.json")
    with open(model_json, "w") as f:
        json.dump(info, f, indent=1)
    data, data_vocab, data_kind = ensure_data(args, mt, work, info["vocab_size"], args.seq_len)
    text = apply_overrides(base, fixed + overrides + [("training", "dataset", data)])
    with open(deck, "w") as f:
        f.write(text)
    device = deck_value(text, "training", "device") or "cpu"
    torch_device = "cuda" if device == "cuda" else "cpu"
    precision = "bf16" if deck_value(text, "training", "mixed_precision_param") == "bfloat16" else "fp32"
    print(f"gpu_step_bench: {info['name']} {info['flavor']} shape dim {info['dim']}, {info['n_layers']} layers, "
          f"{info['n_heads']}/{info['n_kv_heads']} heads, FFN {info['ffn_dim']}, vocab {info['vocab_size']}, "
          f"seq_len {args.seq_len}; meshtrain from {mt_kind} {build}; device {device}; work {work}", flush=True)

    # meshtrain: the largest local batch that fits, probed with short runs (the peak is reached in
    # the first step, once AdamW's state exists), then measured with --steps at that batch.
    batches = [args.batch] if args.batch else [b for b in (2 ** i for i in range(20)) if b <= args.max_batch]
    trials = []
    for b in batches if not args.batch else []:
        t = meshtrain_trial(mt, deck, b, args.search_steps, 1, work, env, args.trial_timeout)
        trials.append(t)
        msg = (f"{b * args.seq_len / t['median_step_s']:.0f} tokens/s, step {t['median_step_s']:.4f} s, "
               f"peak {t['memory_peak_bytes'] / 2**30:.2f} GiB") if t["status"] == "ok" else "out of memory"
        print(f"  meshtrain local batch {b} ({args.search_steps}-step probe): {msg}", flush=True)
        if t["status"] == "oom":
            break
    ok = [t for t in trials if t["status"] == "ok"]
    if trials and not ok:
        die(f"meshtrain does not fit local batch {batches[0]} on this device: {trials[0].get('error', '')}")
    batch = args.batch or ok[-1]["batch"]
    best = meshtrain_trial(mt, deck, batch, args.steps, args.warmup, work, env, args.trial_timeout,
                           sample_clocks=device == "cuda")
    if best["status"] != "ok":
        die(f"meshtrain at local batch {batch} ran out of memory: {best.get('error', '')}")
    best.update(rates(best["median_step_s"], best["batch"], args.seq_len, info["flops_per_token"], args.peak_tflops))
    print(f"  meshtrain local batch {batch} ({args.steps} steps): {best['tokens_per_s']:.0f} tokens/s", flush=True)

    kernels = nsys_kernels(args, mt, deck, best["batch"], work, env) if device == "cuda" else {
        "skipped": "not a CUDA run"}

    torch_res = {}
    if not args.no_torch:
        for mode in ("eager", "compile"):
            r = torch_best(args, mode, best["batch"], model_json, data_vocab, work, torch_device, precision)
            if r["status"] == "ok":
                r.update(rates(r["median_step_s"], r["batch"], args.seq_len, info["flops_per_token"], args.peak_tflops))
                r["same_batch"] = r["batch"] == best["batch"]
            torch_res[mode] = r
            print(f"  pytorch {mode}: {r['status']}" + (f", {r['tokens_per_s']:.0f} tokens/s at batch {r['batch']}"
                                                       if r["status"] == "ok" else f" ({r.get('error', '')[:200]})"),
                  flush=True)

    ratios = {f"meshtrain_over_{m}": best["tokens_per_s"] / r["tokens_per_s"]
              for m, r in torch_res.items() if r["status"] == "ok"}
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode != 0
    gpu = gpu_info()
    device_name = (gpu or {}).get("name") or next((r.get("device_name") for r in torch_res.values()
                                                    if r.get("device_name")), None) or platform.machine()
    result = {
        "benchmark": "gpu_step_bench", "smoke": args.smoke,
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit + ("-dirty" if dirty else ""),
        "host": platform.node(), "device": device, "device_name": device_name, "gpu": gpu,
        "meshtrain_from": f"{mt_kind}: {build}", "deck": deck, "model": info, "seq_len": args.seq_len,
        "steps": args.steps, "warmup": args.warmup, "peak_tflops": args.peak_tflops,
        "data": {"path": data, "ids_below": data_vocab, "kind": data_kind},
        "meshtrain": best, "batch_search": [{k: t.get(k) for k in ("batch", "status", "median_step_s",
                                                                   "memory_peak_bytes", "error")} for t in trials],
        "pytorch": torch_res, "ratios": ratios, "kernels": kernels,
    }
    with open(out_json + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(out_json + ".tmp", out_json)

    gib = lambda b: f"{b / 2**30:.2f} GiB" if b else "—"  # noqa: E731
    print(f"\n{info['name']} {info['flavor']} shape, seq_len {args.seq_len}, {device_name}, "
          f"MFU against {args.peak_tflops:g} TFLOP/s; {args.steps} steps, first {args.warmup} skipped")
    print(f"{'':18} {'batch':>5} {'step (s)':>9} {'tokens/s':>10} {'TFLOPS':>8} {'MFU':>6} {'peak memory':>12}")
    rows = [("meshtrain", best)] + [(f"pytorch {m}", r) for m, r in torch_res.items()]
    for name, r in rows:
        if r.get("status", "ok") != "ok":
            print(f"{name:18} {r.get('status')}: {r.get('error', '')[:90]}")
            continue
        print(f"{name:18} {r['batch']:5d} {r['median_step_s']:9.4f} {r['tokens_per_s']:10.0f} {r['tflops']:8.1f} "
              f"{100 * r['mfu']:5.1f}% {gib(r.get('memory_peak_bytes')):>12}")
    for k, v in ratios.items():
        print(f"{k.replace('_over_', ' / ').replace('_', ' ')} tokens/s: {v:.2f}x")
    if device == "cuda":  # a step slower than its kernels: clocks under sustained load, or host waits
        for name, r in rows:
            if r.get("status", "ok") == "ok":
                print(f"GPU clocks while busy, {name}: {describe_clocks(r.get('gpu_clocks'))}")
    if trials:
        print(f"meshtrain batch search ({args.search_steps}-step probes): " + ", ".join(
            f"{t['batch']}: " + (f"{t['batch'] * args.seq_len / t['median_step_s']:.0f} tok/s, "
                                 f"{t['memory_peak_bytes'] / 2**30:.1f} GiB" if t["status"] == "ok"
                                 else "out of memory") for t in trials))
    if kernels.get("top"):
        print(f"top kernels (nsys, meshtrain batch {kernels['batch']}, {kernels['steps']} steps, "
              f"{kernels['kernel_time_total_s']:.2f} s of kernel time):")
        print(f"{'share':>7} {'total ms':>10} {'calls':>7} {'avg us':>9}  name")
        for k in kernels["top"]:
            print(f"{k['share_pct']:6.1f}% {k['total_ns'] / 1e6:10.1f} {k['instances'] or 0:7d} "
                  f"{(k['avg_ns'] or 0) / 1e3:9.1f}  {k['name'][:90]}")
    else:
        print(f"kernel breakdown: {kernels.get('skipped', 'none')}")
    print(f"JSON: {out_json}")


if __name__ == "__main__":
    main()
