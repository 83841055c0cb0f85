#!/usr/bin/env python3
"""perf/ckpt_bench: save and load bandwidth of meshtrain's sharded HDF5 checkpoints against dd in
the same directory and the same run.

For each rank count (default 1, 2, 4), FSDP over all ranks, a model of a few hundred MB of
checkpoint (parameters + AdamW's two moments, fp32; default dim 512, 8 layers, vocab 8192: 400 MB):
  save: a 1-step run saves step 1 — the time from entering the save to the published file
        (parallel HDF5 write, flush, close, fsync, rename, `latest`), from metrics.jsonl's
        checkpoint_save record;
  load: a rerun resumes from it — the time to read every rank's shards and verify their XXH3
        checksums (checkpoint_load record);
  dd:   `dd bs=4M conv=fdatasync` writing the same number of bytes to the same directory, then
        `dd bs=4M` reading them back, once before and once after each meshtrain save / load;
        and `dd bs=4M` reading the checkpoint file itself (evicted), twice right before each
        load — the reference for loads: the same bytes where they lie on the disk (on this VM a
        file dd has just written sequentially reads up to 1.6x faster than the checkpoint file).
--async-cost instead measures what saving costs the training loop: for each rank count, runs of
--steps steps saving every --interval steps without checkpoints, with synchronous saves and with
[checkpoint] async_mode = "async", interleaved and repeated --repeat times. Per run: the mean
step time (metrics step_time_s: the step's own work, which a background write slows by competing
for cores and memory bandwidth), the mean blocking time of a save (checkpoint_save blocking_s:
the whole write for sync; staging plus any wait for the previous write for async) and the mean
background write time (checkpoint_write seconds); the loop time per step is step time + blocking
time × saves per step. The first step (warm-up) and the last (its save is waited for at the end)
are left out. The median over the repeats is reported.

--elastic loads each checkpoint on another rank count than the one that saved it (the next of
--ranks, cyclically: 1 -> 2, 2 -> 4, 4 -> 1), with a global batch of max(--ranks) on both sides, so
every rank reads other hyperslabs than the writer's (the restart on a new allocation).

Each is repeated --repeat times (default 3) and the best of each is compared (a shared disk's rate
swings between runs; the best is the least disturbed). Loads are also compared run by run with
the dd read just before each (the disk's rate drifts over minutes, and the best of six dd reads
against the best of three loads favours dd); the median of these paired ratios is printed too.
Prints MB/s and the ratio to dd, with the spread (slowest / best) of both sides; writes JSON. A benchmark, not a test: nothing asserts on time.
Before every read (meshtrain's load and dd's) the file's pages are evicted from the page cache with
posix_fadvise(POSIX_FADV_DONTNEED) (no privileges needed; the files are synced, so the pages are
clean), so both read from the disk — a restart on a new allocation does too. --cached keeps the
pages (memory-speed reads for both).

On a virtual machine whose kernel reports free pages to the hypervisor (virtio-balloon free page
reporting), memory freed by one run is handed back within moments and the next touch of it costs a
host fault: 3.2-3.6 s per GiB against 0.47 s here. A load needs fresh memory (its tensors and the
page cache of its reads) where dd reuses a 4 MiB buffer, so such a VM adds to the load alone a
cost no restart on a real node pays, and one that swings with what ran just before. The state is
printed at the start; --hold-page-reporting (root) holds the reporting off for the run and touches
--warm-mib of memory once (perf/page_reporting.py), and restores the setting afterwards.

usage: /usr/bin/python3 perf/ckpt_bench.py [--ranks 1 2 4] [--dim 512] [--layers 8] [--vocab 8192]
           [--repeat 3] [--cached] [--dir DIR] [--data H5] [--out DIR] [--json PATH] [--binary build/bin/meshtrain]
       /usr/bin/python3 perf/ckpt_bench.py --elastic [--ranks 1 2 4] ...
       /usr/bin/python3 perf/ckpt_bench.py --hold-page-reporting [--warm-mib 4096] ...  (root; see below)
       /usr/bin/python3 perf/ckpt_bench.py --async-cost [--steps 12] [--interval 1] [--seq-len 32] [--ranks ...] ...
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no perf/__pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_volume import ROOT, add_run_arguments, ensure_data, write_result  # noqa: E402
import page_reporting  # noqa: E402


def run_train(args, data, folder, n, steps, extra=(), global_batch=None):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n), args.binary, "train",
           "--deck", os.path.join(ROOT, "inputs/llama3_debug.toml"), f"--training.dataset={data}",
           f"--job.dump_folder={folder}", "--validation.enable=false", "--metrics.log_freq=1",
           f"--model.dim={args.dim}", f"--model.n_layers={args.layers}", "--model.n_heads=8", "--model.n_kv_heads=8",
           f"--model.vocab_size={args.vocab}", "--training.local_batch_size=1", f"--training.seq_len={args.seq_len}",
           f"--training.global_batch_size={global_batch or n}", f"--training.steps={steps}"]
    # extra's own checkpoint switches replace the defaults (a key may be given once)
    cmd += [a for a in ("--checkpoint.enable=true", "--checkpoint.interval=1", "--checkpoint.keep_latest_k=1")
            if a.split("=")[0] not in {e.split("=")[0] for e in extra}] + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    recs = [json.loads(l) for l in open(os.path.join(folder, "metrics.jsonl"))]
    return recs if extra else [r for r in recs if r.get("event") in ("checkpoint_save", "checkpoint_load")]


def evict(path):
    """Drops `path`'s (clean) pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def dd_read(args, path):
    """MB/s of dd reading `path` (evicted first unless --cached): the same bytes meshtrain loads,
    where they lie on the disk."""
    if not args.cached:
        evict(path)
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M"], check=True, capture_output=True)
    return os.path.getsize(path) / 1e6 / (time.perf_counter() - t0)


def dd(args, path, nbytes):
    """(write MB/s, read MB/s) of dd moving nbytes through `path`."""
    count = max(1, nbytes // (4 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={count}", "conv=fdatasync"],
                   check=True, capture_output=True)
    tw = time.perf_counter() - t0
    if not args.cached:
        evict(path)
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M"], check=True, capture_output=True)
    tr = time.perf_counter() - t0
    os.remove(path)
    mb = count * 4 * 1.048576
    return mb / tw, mb / tr


ASYNC_MODES = {"none": ["--checkpoint.enable=false"], "sync": [], "async": ["--checkpoint.async_mode=async"]}


def async_cost_run(args, data, folder, n, mode):
    """One run of --async-cost: {step_s, blocking_s, write_s, loop_s} (means, seconds; the loop
    time per step is step_s + blocking_s × saves per step)."""
    shutil.rmtree(folder, ignore_errors=True)
    recs = run_train(args, data, folder, n, args.steps, ASYNC_MODES[mode] + [f"--checkpoint.interval={args.interval}"])
    last = args.steps
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    steps = [r["step_time_s"] for r in recs if "step_time_s" in r and 1 < r["step"] < last]
    saves = [r["blocking_s"] for r in recs if r.get("event") == "checkpoint_save" and 1 < r["step"] < last]
    writes = [r["seconds"] for r in recs if r.get("event") == "checkpoint_write" and r["ok"] and r["step"] < last]
    size = max([r.get("bytes", 0) for r in recs if r.get("event") in ("checkpoint_save", "checkpoint_write")] + [0])
    shutil.rmtree(folder, ignore_errors=True)
    per_step = mean(saves) / args.interval if mode != "none" else 0.0
    return {"step_s": mean(steps), "blocking_s": mean(saves), "write_s": mean(writes), "loop_s": mean(steps) + per_step,
            "bytes": size}


def async_cost(args, data, base):
    """--async-cost: the training loop's time per step without checkpoints, with sync and with
    async saves, in the same invocation (modes interleaved within each repeat)."""
    rows = []
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    for n in args.ranks:
        runs = {m: [] for m in ASYNC_MODES}
        for _ in range(args.repeat):
            for m in ASYNC_MODES:
                runs[m].append(async_cost_run(args, data, os.path.join(base, f"async_np{n}_{m}"), n, m))
        row = {"ranks": n, "steps": args.steps, "interval": args.interval, "runs": runs,
               "bytes": max(r["bytes"] for m in runs for r in runs[m])}
        for m in ASYNC_MODES:
            for k in ("step_s", "blocking_s", "write_s", "loop_s"):
                row[f"{m}_{k}"] = median([r[k] for r in runs[m]])
        for m in ("sync", "async"):
            row[f"{m}_cost_s"] = row[f"{m}_loop_s"] - row["none_loop_s"]  # per step, over no checkpoints
        rows.append(row)
        print(f"{n} ranks, {row['bytes'] / 1e6:.0f} MB per checkpoint, a save every {args.interval} step(s), "
              f"median of {args.repeat}:", flush=True)
        print(f"  {'mode':6} {'step s':>8} {'save blocks s':>14} {'bg write s':>11} {'loop s/step':>12} {'cost s/step':>12}")
        for m in ASYNC_MODES:
            cost = f"{row[m + '_cost_s']:12.3f}" if m != "none" else f"{'-':>12}"
            write = f"{row[m + '_write_s']:11.3f}" if m == "async" else f"{'-':>11}"
            print(f"  {m:6} {row[m + '_step_s']:8.3f} {row[m + '_blocking_s']:14.3f} {write} {row[m + '_loop_s']:12.3f} {cost}",
                  flush=True)
    write_result(args.json, {"mode": "async_cost", "dim": args.dim, "layers": args.layers, "vocab": args.vocab,
                             "seq_len": args.seq_len, "dir": base, "rows": rows})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=3, help="runs per rank count; the best of each side is compared")
    p.add_argument("--cached", action="store_true", help="keep files in the page cache before reads")
    p.add_argument("--dir", help="where checkpoints and dd's file go (default: under --out)")
    p.add_argument("--seq-len", type=int, default=32, help="training sequence length (a longer one makes steps longer)")
    p.add_argument("--async-cost", action="store_true", help="step-time cost of async saves against sync saves")
    p.add_argument("--elastic", action="store_true", help="load on the next rank count of --ranks than the one that saved")
    p.add_argument("--steps", type=int, default=12, help="--async-cost: steps per run")
    p.add_argument("--interval", type=int, default=1, help="--async-cost: steps between saves")
    p.add_argument("--hold-page-reporting", action="store_true",
                   help="root, VMs with free page reporting: hold it off for the run (perf/page_reporting.py)")
    p.add_argument("--warm-mib", type=int, default=4096,
                   help="--hold-page-reporting: MiB of memory touched once before the runs")
    add_run_arguments(p, "ckpt_bench")
    args = p.parse_args()
    if args.async_cost and args.json == os.path.join(ROOT, "perf/out", "ckpt_bench.json"):
        args.json = os.path.join(ROOT, "perf/out", "ckpt_bench_async.json")
    os.makedirs(args.out, exist_ok=True)
    data = ensure_data(args.data, args.out, args.binary)
    base = args.dir or os.path.join(args.out, "runs")
    os.makedirs(base, exist_ok=True)
    reporting = page_reporting.state()
    if reporting is None:
        print("free page reporting: not in this kernel (freed memory stays with this machine)", flush=True)
    else:
        print(f"free page reporting: on (order {reporting['order']}; {reporting['reported_kib'] / 2**20:.0f} GiB handed "
              f"to the hypervisor since boot) — a run needing fresh memory pays for it"
              f"{'; held off for this run' if args.hold_page_reporting else ' (--hold-page-reporting holds it off)'}",
              flush=True)
    if not args.hold_page_reporting:
        return measure(args, data, base, {"page_reporting": reporting, "page_reporting_held": False})
    with page_reporting.hold(warm_bytes=args.warm_mib << 20) as held:
        print(f"  held at order {held['order_held']}; {args.warm_mib} MiB touched once in {held['warm_s']:.1f} s",
              flush=True)
        return measure(args, data, base, {"page_reporting": reporting, "page_reporting_held": True, **held})


def measure(args, data, base, environment):
    """The runs of the save/load comparison (or --async-cost); writes args.json with
    `environment` (the free page reporting state) among its fields."""
    if args.async_cost:
        return async_cost(args, data, base)
    rows = []
    gb = max(args.ranks) if args.elastic else None
    for i, n in enumerate(args.ranks):
        m = args.ranks[(i + 1) % len(args.ranks)] if args.elastic else n  # the rank count that loads
        folder = os.path.join(base, f"np{n}")
        saves, loads, dd_ws, dd_rs, dd_same, paired = [], [], [], [], [], []
        dd_file = os.path.join(base, "dd.bin")
        for _ in range(args.repeat):
            shutil.rmtree(folder, ignore_errors=True)
            save = [r for r in run_train(args, data, folder, n, 1, global_batch=gb) if r.get("event") == "checkpoint_save"][-1]
            w0, r0 = dd(args, dd_file, save["bytes"])
            ckpt = os.path.join(folder, "checkpoints", "step-00000001.h5")
            # dd reads the checkpoint twice, the second time right before the load, which is
            # compared with that read: the same bytes, in the same minute and cache state (a dd
            # read after the load is slower here, whose run has just written its own checkpoint).
            same0, same1 = dd_read(args, ckpt), dd_read(args, ckpt)  # the load's run replaces the file
            if not args.cached:
                evict(ckpt)
            load = next(r for r in run_train(args, data, folder, m, 2, global_batch=gb) if r.get("event") == "checkpoint_load")
            w1, r1 = dd(args, dd_file, save["bytes"])
            dd_same += [same0, same1]
            paired.append(save["bytes"] / 1e6 / load["seconds"] / same1)
            saves.append(save["seconds"])
            loads.append(load["seconds"])
            dd_ws += [w0, w1]
            dd_rs += [r0, r1]
            nbytes = save["bytes"]
        shutil.rmtree(folder, ignore_errors=True)
        mb = nbytes / 1e6
        row = {"ranks": n, "load_ranks": m, "bytes": nbytes, "repeat": args.repeat, "save_s": saves, "load_s": loads,
               "dd_write_mb_s": dd_ws, "dd_read_mb_s": dd_rs,
               "save_mb_s": mb / min(saves), "load_mb_s": mb / min(loads),
               "dd_write_best_mb_s": max(dd_ws), "dd_read_best_mb_s": max(dd_rs),
               "dd_read_ckpt_mb_s": dd_same, "dd_read_ckpt_best_mb_s": max(dd_same)}
        row["save_vs_dd"] = row["save_mb_s"] / row["dd_write_best_mb_s"]
        row["load_vs_dd"] = row["load_mb_s"] / row["dd_read_ckpt_best_mb_s"]
        row["load_vs_dd_fresh_file"] = row["load_mb_s"] / row["dd_read_best_mb_s"]
        row["load_vs_dd_paired"] = paired
        row["load_vs_dd_paired_median"] = sorted(paired)[len(paired) // 2]
        rows.append(row)
        print(f"{n} ranks{f' (loaded on {m})' if m != n else ''}: {mb:.0f} MB  save {row['save_mb_s']:.0f} MB/s (spread {max(saves) / min(saves):.1f}x) = "
              f"{row['save_vs_dd']:.2f}x dd write {row['dd_write_best_mb_s']:.0f} (spread "
              f"{max(dd_ws) / min(dd_ws):.1f}x)  load {row['load_mb_s']:.0f} MB/s (spread {max(loads) / min(loads):.1f}x) = "
              f"{row['load_vs_dd']:.2f}x dd reading the checkpoint {row['dd_read_ckpt_best_mb_s']:.0f} (spread "
              f"{max(dd_same) / min(dd_same):.1f}x); dd reading its own fresh file {row['dd_read_best_mb_s']:.0f} "
              f"(spread {max(dd_rs) / min(dd_rs):.1f}x, load {row['load_vs_dd_fresh_file']:.2f}x of it)\n"
              f"  load / dd of the checkpoint read just before it, per run: "
              f"{' '.join(f'{x:.2f}' for x in paired)} (median {row['load_vs_dd_paired_median']:.2f}x)", flush=True)
    write_result(args.json, {"dim": args.dim, "layers": args.layers, "vocab": args.vocab, "dir": base, **environment,
                             "elastic": args.elastic, "rows": rows})


if __name__ == "__main__":
    main()
