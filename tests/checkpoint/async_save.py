#!/usr/bin/env python3
"""Asynchronous checkpoints ([checkpoint] async_mode) through the real binary.

equal (default): on each --layout "NAME NP [overrides]", a synchronous and an asynchronous run
  (async_mode = --mode-value) of the same 8 steps save every 2 steps (the last save model-only,
  exported by last_save_in_hf, which waits for the background write).
  Every checkpoint of the async run equals the sync run's bitwise in every /model and /optimizer
  dataset, in /checksums and in the /train_state attributes (the HDF5 files themselves may differ
  in metadata); the loss curves are identical. Then a folder holding only the async run's step-4
  checkpoint resumes (asynchronously) to step 8: its losses and final parameters equal the sync
  run's bit for bit.

killed: 4 ranks (FSDP), async saves every 3 of 8 steps. During the background write of step 6
  one rank dies after writing its first shard (MESHTRAIN_TEST_KILL_SAVE_AT_STEP=6, an abrupt _Exit
  on the writer thread); the job fails, step 6 is never published and `latest` still names step 3,
  unchanged; the rerun resumes from it and matches an uninterrupted synchronous run bit for bit.

failed: a background write that cannot create its file (2 ranks) is reported in the log and in
  metrics.jsonl (checkpoint_write, ok false, the error), never published, and stops the run at
  the next save with status 2; `latest` still names the previous checkpoint.

usage: async_save.py --meshtrain BIN --deck DECK --data H5 --out DIR [--check equal|killed|failed]
                     [--mode-value async] [--layout "NAME NP [overrides]"] ... [-- overrides]
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


def train(args, np_, folder, extra, kill_at=None):
    """Runs meshtrain on np_ ranks into folder; returns the CompletedProcess."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), args.meshtrain, "train", "--deck",
           args.deck, f"--training.dataset={args.data}", f"--job.dump_folder={folder}", "--checkpoint.enable=true",
           "--metrics.log_freq=1", "--validation.enable=false"] + extra + args.extra
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if kill_at:
        env["MESHTRAIN_TEST_KILL_SAVE_AT_STEP"] = str(kill_at)
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def datasets(f):
    """{path: array} of every dataset of an open h5py file."""
    out = {}
    f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def same_checkpoint(a, b):
    """'' when files a and b hold bitwise equal /model, /optimizer, /checksums and /train_state,
    else what differs."""
    with h5py.File(a, "r") as f, h5py.File(b, "r") as g:
        da, db = datasets(f), datasets(g)
        if set(da) != set(db):
            return f"datasets differ: {sorted(set(da) ^ set(db))[:5]}"
        if not any(k.startswith("optimizer/") for k in da) and f["meta"].attrs["model_only"] == 0:
            return "no /optimizer datasets"
        for k in sorted(da):
            x, y = da[k], db[k]
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return f"dataset {k} differs"
        ta, tb = dict(f["train_state"].attrs), dict(g["train_state"].attrs)
        if set(ta) != set(tb) or any(ta[k] != tb[k] for k in ta):
            return f"/train_state differs: {ta} vs {tb}"
    return ""


def check_equal(args, checks):
    steps = ["--training.steps=8", "--checkpoint.interval=2", "--checkpoint.last_save_model_only=true"]
    mode = [f"--checkpoint.async_mode={args.mode_value}"]
    hf = ["--checkpoint.last_save_in_hf=true"]  # the export reads the last save: it waits for the write
    for spec in args.layout:
        name, n, *over = spec.split()
        n = int(n)
        sync_dir, async_dir = os.path.join(args.out, name, "sync"), os.path.join(args.out, name, "async")
        res = train(args, n, sync_dir, over + steps + hf)
        checks.append((f"{name}: sync run", res.returncode == 0))
        res_a = train(args, n, async_dir, over + steps + mode + hf)
        checks.append((f"{name}: async run", res_a.returncode == 0))
        if res.returncode or res_a.returncode:
            return res.stdout[-2000:] + res.stderr[-2000:] + res_a.stdout[-2000:] + res_a.stderr[-2000:]
        for step in (2, 4, 6, 8):
            fname = f"step-{step:08d}.h5"
            diff = same_checkpoint(os.path.join(sync_dir, "checkpoints", fname), os.path.join(async_dir, "checkpoints", fname))
            checks.append((f"{name}: async {fname} equals sync bitwise {diff}".rstrip(), diff == ""))
        # The comparison can fail: consecutive checkpoints differ.
        checks.append((f"{name}: (step 2 and step 4 differ)", same_checkpoint(
            os.path.join(sync_dir, "checkpoints", "step-00000002.h5"), os.path.join(async_dir, "checkpoints", "step-00000004.h5")) != ""))
        checks.append((f"{name}: latest names step 8",
                       open(os.path.join(async_dir, "checkpoints", "latest")).read().strip() == "step-00000008.h5"))
        checks.append((f"{name}: loss curves identical", losses(sync_dir) == losses(async_dir)))
        exported = [os.path.join(d, "checkpoints", "step-00000008-hf", "model.safetensors") for d in (sync_dir, async_dir)]
        same_hf = all(map(os.path.exists, exported)) and open(exported[0], "rb").read() == open(exported[1], "rb").read()
        checks.append((f"{name}: last_save_in_hf folders' model.safetensors identical", same_hf))
        # Resume from the async run's step-4 checkpoint.
        resumed = os.path.join(args.out, name, "resumed")
        os.makedirs(os.path.join(resumed, "checkpoints"))
        shutil.copy(os.path.join(async_dir, "checkpoints", "step-00000004.h5"), os.path.join(resumed, "checkpoints"))
        with open(os.path.join(resumed, "checkpoints", "latest"), "w") as f:
            f.write("step-00000004.h5\n")
        res = train(args, n, resumed, over + steps + mode)
        checks.append((f"{name}: resumed from the async step-4 checkpoint", res.returncode == 0))
        if res.returncode:
            return res.stdout[-3000:] + res.stderr[-3000:]
        a, b = losses(sync_dir), losses(resumed)
        checks.append((f"{name}: losses of steps 5-8 equal the sync run's bitwise",
                       sorted(b) == [5, 6, 7, 8] and all(a[s] == b[s] for s in b)))
        checks.append((f"{name}: final parameters equal the sync run's bitwise", same_final_params(sync_dir, resumed)))
    return ""


def check_killed(args, checks):
    steps = ["--training.steps=8", "--checkpoint.interval=3"]
    mode = [f"--checkpoint.async_mode={args.mode_value}"]
    ref, work = os.path.join(args.out, "uninterrupted"), os.path.join(args.out, "interrupted")
    ck = os.path.join(work, "checkpoints")
    res = train(args, 4, ref, steps)
    checks.append(("uninterrupted synchronous run", res.returncode == 0))
    res = train(args, 4, work, steps + mode, kill_at=6)
    context = res.stdout[-2000:] + res.stderr[-2000:]
    checks.append(("a rank killed during the background write of step 6 (the job fails)", res.returncode != 0))
    checks.append(("step 3 was published", os.path.exists(os.path.join(ck, "step-00000003.h5"))))
    checks.append(("no published step 6", not os.path.exists(os.path.join(ck, "step-00000006.h5"))))
    latest = os.path.join(ck, "latest")
    checks.append(("latest still names step 3", os.path.exists(latest) and open(latest).read().strip() == "step-00000003.h5"))
    if os.path.exists(os.path.join(ck, "step-00000003.h5")):
        diff = same_checkpoint(os.path.join(ck, "step-00000003.h5"), os.path.join(ref, "checkpoints", "step-00000003.h5"))
        checks.append((f"step 3 equals the synchronous run's {diff}".rstrip(), diff == ""))
    res = train(args, 4, work, steps + mode)
    checks.append(("the rerun succeeds", res.returncode == 0))
    if res.returncode == 0:
        a, b = losses(ref), losses(work)
        checks.append(("it resumed from step 3: losses of steps 4-8 equal bitwise", all(a[s] == b[s] for s in range(4, 9))))
        checks.append(("final parameters equal bitwise", same_final_params(ref, work)))
        checks.append(("latest names step 8", open(latest).read().strip() == "step-00000008.h5"))
    return context + res.stdout[-2000:] + res.stderr[-2000:]


def check_failed(args, checks):
    """A background write that fails (step 4's .tmp name is taken by a folder, so the file cannot
    be created) is reported in the log and metrics.jsonl, is never published, and stops the run at
    the next save with status 2; `latest` still names step 2."""
    work = os.path.join(args.out, "failed")
    os.makedirs(os.path.join(work, "checkpoints", "step-00000004.h5.tmp"))
    res = train(args, 2, work, ["--training.steps=8", "--checkpoint.interval=2",
                                f"--checkpoint.async_mode={args.mode_value}"])
    ck = os.path.join(work, "checkpoints")
    recs = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
    writes = {r["step"]: r for r in recs if r.get("event") == "checkpoint_write"}
    checks.append((f"the run stops with status 2 (got {res.returncode})", res.returncode == 2))
    checks.append(("step 2 written and reported ok", writes.get(2, {}).get("ok") is True))
    checks.append(("step 4's failure is in metrics.jsonl, naming the file",
                   writes.get(4, {}).get("ok") is False and "step-00000004.h5.tmp" in writes[4].get("error", "")))
    checks.append(("the log says the background write failed", "background write of step 4 failed" in res.stderr + res.stdout))
    checks.append(("no step 4 or 6 published", not any(os.path.exists(os.path.join(ck, f"step-{s:08d}.h5")) for s in (4, 6))))
    checks.append(("latest names step 2", open(os.path.join(ck, "latest")).read().strip() == "step-00000002.h5"))
    steps = sorted(r["step"] for r in recs if "loss" in r)
    checks.append((f"training stopped at the save of step 6 (steps {steps[0]}-{steps[-1]})", steps == list(range(1, 7))))
    return res.stdout[-3000:] + res.stderr[-3000:]


def main():
    p = run_arguments(__doc__)
    p.add_argument("--check", choices=["equal", "killed", "failed"], default="equal")
    p.add_argument("--mode-value", default="async", help="the async_mode under test")
    p.add_argument("--layout", action="append", default=[])
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    checks = []
    context = {"equal": check_equal, "killed": check_killed, "failed": check_failed}[args.check](args, checks)
    report(checks, context)


if __name__ == "__main__":
    main()
