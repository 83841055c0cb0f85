#!/usr/bin/env python3
"""[profiling] and [metrics] enable_tensorboard end to end (FSDP on 2 ranks, 4 steps):

- a Chrome trace per rank after steps 2 and 4 (profile_freq 2, active 1, warmup 0) and none
  after steps 1 and 3: valid Trace Event JSON whose events include the step span, every unit's
  forward and backward, the optimizer and the FSDP collectives;
- TensorBoard event files (rank 0 only, then every rank with save_for_all_ranks) whose records
  pass both masked CRC-32C checks and whose scalars equal metrics.jsonl step by step
  (validation/read_tfevents.py, Debian's python3-protobuf and python3-crc32c).

usage: traces_tensorboard.py --meshtrain BIN --deck DECK --data H5 --out DIR
"""
import glob
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
from ckpt_common import report  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "equivalence"))
from compare_runs import run_arguments  # noqa: E402

READER = os.path.join(HERE, "..", "..", "validation", "read_tfevents.py")
TAGS = "loss,grad_norm,lr,tokens_per_s,tokens_per_s_per_rank,tflops_per_rank,mfu,step_time_s,comm_wait_s,memory_peak_bytes,eta_s,val_loss"
# What every rank logs alike (timings are each rank's own; metrics.jsonl holds rank 0's).
GLOBAL_TAGS = "loss,grad_norm,lr,memory_peak_bytes,val_loss"


def train(args, folder, extra):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", args.meshtrain, "train", "--deck", args.deck,
           f"--training.dataset={args.data}", f"--job.dump_folder={folder}", "--training.steps=4", "--metrics.log_freq=1",
           "--validation.enable=true", "--validation.freq=2", "--validation.steps=1",
           "--metrics.enable_tensorboard=true"] + extra
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return res.returncode, f"$ {' '.join(cmd)}\n{res.stdout}{res.stderr}"


def compare_tb(path, metrics, tags=TAGS):
    res = subprocess.run(["/usr/bin/python3", READER, path, "--compare-metrics", metrics, "--tags", tags],
                         capture_output=True, text=True)
    return res.returncode == 0, res.stdout + res.stderr


def trace_ok(path):
    """(ok, why) for one rank's trace file."""
    try:
        events = json.load(open(path))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        return False, f"{path}: {e}"
    spans = [e for e in events if e.get("ph") == "X"]
    names = {(e.get("cat"), e["name"]) for e in spans}
    want = [("forward", u) for u in ("tok_embeddings", "layers.0", "layers.1", "output")] + \
           [("backward", u) for u in ("tok_embeddings", "layers.0", "layers.1", "output")] + [("optimizer", "optimizer")]
    missing = [w for w in want if w not in names]
    steps = [e["name"] for e in spans if e.get("cat") == "step"]
    collectives = [e for e in events if e.get("cat") == "collective"]
    ok = not missing and len(steps) == 1 and collectives and all(e.get("dur", 0) >= 0 for e in spans)
    return ok, f"{path}: {len(events)} events, steps {steps}, {len(collectives)} collective events, missing {missing}"


def main():
    args = run_arguments(__doc__).parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    checks, logs = [], []

    run = os.path.join(args.out, "rank0")
    rc, log = train(args, run, ["--profiling.enable_profiling=true", "--profiling.profile_freq=2",
                                "--profiling.profiler_warmup=0", "--profiling.profiler_active=1"])
    logs.append(log)
    checks.append(("profiled run with TensorBoard exits 0", rc == 0))
    traces = sorted(os.path.relpath(p, run) for p in glob.glob(os.path.join(run, "profile_traces", "*", "*.json")))
    want = [f"profile_traces/iteration_{s}/rank{r}_trace.json" for s in (2, 4) for r in (0, 1)]
    checks.append(("one trace per rank after steps 2 and 4, none after 1 and 3", traces == sorted(want)))
    for t in traces:
        ok, why = trace_ok(os.path.join(run, t))
        logs.append(why)
        checks.append((f"{t}: units forward/backward, optimizer, step span, collectives", ok))
    files = glob.glob(os.path.join(run, "tb", "events.out.tfevents.*"))
    checks.append(("rank 0 alone writes one event file into tb/", len(files) == 1))
    ok, out = compare_tb(os.path.join(run, "tb"), os.path.join(run, "metrics.jsonl"))
    logs.append(out)
    checks.append(("TensorBoard scalars equal metrics.jsonl (both CRCs verified)", ok))

    every = os.path.join(args.out, "all_ranks")
    rc, log = train(args, every, ["--metrics.save_for_all_ranks=true", "--metrics.save_tb_folder=board"])
    logs.append(log)
    per_rank = [glob.glob(os.path.join(every, "board", f"rank_{r}", "events.out.tfevents.*")) for r in (0, 1)]
    checks.append(("save_for_all_ranks: one event file per rank in board/rank_<R>",
                   rc == 0 and all(len(f) == 1 for f in per_rank)))
    for r in (0, 1):
        ok, out = compare_tb(os.path.join(every, "board", f"rank_{r}"), os.path.join(every, "metrics.jsonl"),
                             TAGS if r == 0 else GLOBAL_TAGS)
        logs.append(out)
        checks.append((f"rank {r}'s scalars equal metrics.jsonl" + (" (the global ones)" if r else ""), ok))
    report(checks, "\n".join(logs))


if __name__ == "__main__":
    main()
