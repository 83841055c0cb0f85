#!/usr/bin/env python3
"""Non-finite steps never reach the optimizer or a checkpoint. On each layout (DDP 2, FSDP 2,
TP 2 x FSDP 2, pp 2 x FSDP 2 with the fault on a stage without the loss; [debug]
inject_nonfinite_grad_step makes one rank's gradient NaN at one step, before any reduction):

stop mode (skip_nonfinite_steps = 0): every rank stops at the poisoned step with exit status 5 and
one line from rank 0 naming the step, the gradient norm and the first parameter with a
non-finite gradient; no metrics record of that step; the checkpoint folder holds only the
earlier step (`latest` names it, no .tmp); rerunning the same command without the injection
resumes from it and continues bit for bit as the uninterrupted run (losses and final model).

skip mode (skip_nonfinite_steps = 1): the poisoned step is logged and skipped; the checkpoints
written before and after it hold identical parameters and AdamW moments (no update), AdamW's
step count lags by one; two poisoned steps in a row stop the run at the second with status 5.

usage: nonfinite.py --meshtrain BIN --deck DECK --data H5 --out DIR [--layout "NAME NP [overrides]"] ...
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import losses, report, same_final_params  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "equivalence"))
from compare_runs import run_arguments  # noqa: E402

P = "--parallelism"
# "NAME NP [rank=R] [overrides]": the fault goes to rank R (default NP - 1). pp2_fsdp2 poisons rank 0,
# which holds pipeline stage 0 and no loss: its gradient goes bad through the output gradient it
# receives, GPipe with 2 rounds of accumulation.
LAYOUTS = [f"ddp2 2 {P}.data_parallel_replicate_degree=2 {P}.data_parallel_shard_degree=1",
           "fsdp2 2",
           f"tp2_fsdp2 4 {P}.tensor_parallel_degree=2",
           f"pp2_fsdp2 4 rank=0 {P}.pipeline_parallel_degree=2 {P}.pipeline_parallel_schedule=GPipe"]


def train(args, np_, folder, extra):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), args.meshtrain, "train",
           "--deck", args.deck, f"--training.dataset={args.data}", f"--job.dump_folder={folder}",
           "--checkpoint.enable=true", "--metrics.log_freq=1", "--validation.enable=false",
           "--training.local_batch_size=1", "--training.global_batch_size=4"] + extra + args.extra
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout + res.stderr, " ".join(cmd)


def folder_files(folder):
    d = os.path.join(folder, "checkpoints")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def latest(folder):
    with open(os.path.join(folder, "checkpoints", "latest")) as f:
        return f.read().strip()


def events(folder, name):
    return [r for r in map(json.loads, open(os.path.join(folder, "metrics.jsonl"))) if r.get("event") == name]


def same_state(a, b):
    """Whether two checkpoint files hold bitwise identical /model and /optimizer datasets."""
    with h5py.File(a) as f, h5py.File(b) as g:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and n.split("/")[0] in ("model", "optimizer") else None)
        return len(names) > 0 and all(n in g and np.array_equal(f[n][()], g[n][()]) for n in names)


def optimizer_step(path):
    with h5py.File(path) as f:
        return int(f["train_state"].attrs["optimizer_step"])


def check_layout(args, name, np_, overrides, rank):
    out = os.path.join(args.out, name)
    shutil.rmtree(out, ignore_errors=True)
    checks, log = [], []
    inject = ["--debug.inject_nonfinite_grad_step=3", f"--debug.inject_nonfinite_grad_rank={rank}"]

    ref = os.path.join(out, "reference")
    rc, text, cmd = train(args, np_, ref, overrides + ["--training.steps=6", "--checkpoint.interval=2"])
    checks.append((f"{name}: reference run (6 steps) exits 0", rc == 0))
    log.append(f"$ {cmd}\n{text}")

    # Stop mode: the poisoned step 3 stops every rank; the folder keeps step 2 only.
    bad = os.path.join(out, "stopped")
    rc, text, cmd = train(args, np_, bad, overrides + ["--training.steps=6", "--checkpoint.interval=2"] + inject)
    log.append(f"$ {cmd}\n{text}")
    lines = [l for l in text.splitlines() if "step 3: gradient norm" in l and "non-finite" in l]
    checks.append((f"{name}: poisoned step 3 exits with status 5", rc == 5))
    checks.append((f"{name}: one line from rank 0 names step 3, the gradient norm and a parameter",
                   len(lines) == 1 and "[rank 0" in lines[0] and "first parameter with a non-finite gradient: " in lines[0]))
    checks.append((f"{name}: no rank logged step 3 or later", "step 3/6" not in text and "step 4/6" not in text))
    checks.append((f"{name}: checkpoint folder holds only step 2 (and latest)",
                   folder_files(bad) == ["latest", "step-00000002.h5"] and latest(bad) == "step-00000002.h5"))
    checks.append((f"{name}: metrics.jsonl has no record of step 3", 3 not in losses(bad)))
    checks.append((f"{name}: no final model written", not os.path.exists(os.path.join(bad, "model_final.h5"))))

    # The same command without the fault resumes from step 2 and continues as if step 3 never went bad.
    rc, text, cmd = train(args, np_, bad, overrides + ["--training.steps=6", "--checkpoint.interval=2"])
    log.append(f"$ {cmd}\n{text}")
    checks.append((f"{name}: rerun resumes from step 2 and exits 0", rc == 0 and "resumed from" in text))
    lr, lb = losses(ref), losses(bad)
    checks.append((f"{name}: resumed losses of steps 3-6 equal the uninterrupted run bit for bit",
                   all(s in lb and lb[s] == lr[s] for s in range(3, 7))))
    checks.append((f"{name}: final model equals the uninterrupted run bit for bit", rc == 0 and same_final_params(ref, bad)))

    # Skip mode: step 3 is skipped (no update), the run finishes.
    skip = os.path.join(out, "skipped")
    rc, text, cmd = train(args, np_, skip, overrides + ["--training.steps=4", "--checkpoint.interval=1",
                                                       "--training.skip_nonfinite_steps=1"] + inject)
    log.append(f"$ {cmd}\n{text}")
    ck = lambda s: os.path.join(skip, "checkpoints", f"step-{s:08d}.h5")  # noqa: E731
    skipped = events(skip, "nonfinite_step_skipped") if rc == 0 else []
    checks.append((f"{name}: skip mode finishes 4 steps with exit 0", rc == 0))
    checks.append((f"{name}: skip mode logs step 3 once (rank 0) and records it",
                   sum("the update was skipped" in l for l in text.splitlines()) == 1 and
                   [r["step"] for r in skipped] == [3]))
    checks.append((f"{name}: skipped step changed no parameter or moment (step-2 == step-3 checkpoint)",
                   rc == 0 and same_state(ck(2), ck(3)) and not same_state(ck(3), ck(4))))
    checks.append((f"{name}: AdamW's step count lags by the skipped step",
                   rc == 0 and optimizer_step(ck(3)) == 2 and optimizer_step(ck(4)) == 3))

    # Two poisoned steps in a row with skip_nonfinite_steps = 1: the second stops the run.
    limit = os.path.join(out, "limit")
    rc, text, cmd = train(args, np_, limit, overrides + ["--training.steps=5", "--checkpoint.interval=1",
                                                        "--training.skip_nonfinite_steps=1",
                                                        "--debug.inject_nonfinite_grad_count=2"] + inject)
    log.append(f"$ {cmd}\n{text}")
    checks.append((f"{name}: skip limit: step 4 (second in a row) stops with status 5",
                   rc == 5 and "step 4: gradient norm" in text and "2 non-finite steps in a row" in text))
    checks.append((f"{name}: skip limit: folder holds steps 2 and 3, latest step 3",
                   folder_files(limit) == ["latest", "step-00000001.h5", "step-00000002.h5", "step-00000003.h5"]
                   and latest(limit) == "step-00000003.h5"))
    return checks, "\n".join(log)


def main():
    p = run_arguments(__doc__)
    p.add_argument("--layout", action="append", default=[], help='"NAME NP [rank=R] [--section.key=value ...]"')
    args = p.parse_args()
    checks, logs = [], []
    for spec in args.layout or LAYOUTS:
        name, np_, *overrides = spec.split()
        rank = int(np_) - 1
        if overrides and overrides[0].startswith("rank="):
            rank = int(overrides.pop(0)[len("rank="):])
        c, log = check_layout(args, name, int(np_), overrides, rank)
        checks += c
        logs.append(log)
    report(checks, "\n".join(logs))


if __name__ == "__main__":
    main()
