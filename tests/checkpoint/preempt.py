#!/usr/bin/env python3
"""Preemption of a running 4-rank job (FSDP): SIGUSR1 sent to mpirun (which forwards it to the
ranks, as Slurm's --signal does) while it trains must make every rank stop at the same step
boundary, save that step's checkpoint, and exit with status 4; a rerun of the same command
resumes from `latest` by itself, and its losses and final parameters equal an uninterrupted run
bit for bit.

usage: preempt.py --meshtrain BIN --deck DECK --data H5 --out DIR [--steps N] [-- overrides]
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time


sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import losses, report, same_final_params  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "equivalence"))
from compare_runs import run_arguments  # noqa: E402


def command(args, folder):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", args.meshtrain, "train", "--deck", args.deck,
            f"--training.dataset={args.data}", f"--job.dump_folder={folder}", "--checkpoint.enable=true",
            "--checkpoint.interval=100000", f"--training.steps={args.steps}", "--metrics.log_freq=1",
            "--validation.enable=false"] + args.extra



def logged_steps(folder):
    return [r["step"] for r in map(json.loads, open(os.path.join(folder, "metrics.jsonl"))) if "loss" in r]


def main():
    p = run_arguments(__doc__)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    ref, work = os.path.join(args.out, "uninterrupted"), os.path.join(args.out, "preempted")
    checks = []
    res = subprocess.run(command(args, ref), env=env, capture_output=True, text=True)
    checks.append(("uninterrupted run", res.returncode == 0))

    proc = subprocess.Popen(command(args, work), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(work, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # wait until training is under way
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    checks.append((f"exit status 4 after the signal (got {proc.returncode})", proc.returncode == 4))
    ck = os.path.join(work, "checkpoints")
    latest = open(os.path.join(ck, "latest")).read().strip() if os.path.exists(os.path.join(ck, "latest")) else ""
    stopped = max(losses(work)) if os.path.exists(metrics) else -1
    checks.append((f"checkpoint of the last step ({stopped}) saved and pointed to by latest ({latest})",
                   latest == f"step-{stopped:08d}.h5" and 0 < stopped < args.steps))
    checks.append(("the log says it was preempted", "preempted by signal 10" in out + err))

    res = subprocess.run(command(args, work), env=env, capture_output=True, text=True)
    checks.append(("the same command resumes and finishes", res.returncode == 0 and f"resumed from" in res.stdout + res.stderr))
    if res.returncode == 0:
        a, b = losses(ref), losses(work)
        checks.append(("every step logged once, losses bitwise equal",
                       logged_steps(work) == list(range(1, args.steps + 1)) and all(a[s] == b[s] for s in a)))
        checks.append(("final parameters bitwise equal", same_final_params(ref, work)))
    report(checks, out[-2000:] + err[-2000:] + res.stdout[-2000:] + res.stderr[-2000:])


if __name__ == "__main__":
    main()
