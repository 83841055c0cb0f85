#!/usr/bin/env python3
"""A save that dies half-way never damages the previous checkpoint (4 ranks, FSDP).

1. A run folder holds only step 3 of an uninterrupted 8-step run (same schedule).
2. It resumes; during the save of step 6 one rank dies after writing its first shard
   (MESHTRAIN_TEST_KILL_SAVE_AT_STEP=6, an abrupt _Exit as a killed rank), leaving a partial
   step-00000006.h5.tmp; the job fails.
3. `latest` still names step 3, which loads; a third run resumes from it to step 8 and its losses
   and final parameters equal an uninterrupted 8-step run bit for bit.

usage: failed_save.py --meshtrain BIN --deck DECK --data H5 --out DIR [-- overrides]
"""
import os
import shutil
import subprocess
import sys


sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import losses, report, same_final_params  # noqa: E402


def run(args, folder, extra, kill_at=None):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", args.meshtrain, "train", "--deck", args.deck,
           f"--training.dataset={args.data}", f"--job.dump_folder={folder}", "--checkpoint.enable=true",
           "--checkpoint.interval=3", "--training.steps=8"] + args.extra + extra
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if kill_at:
        env["MESHTRAIN_TEST_KILL_SAVE_AT_STEP"] = str(kill_at)
    return subprocess.run(cmd, env=env, capture_output=True, text=True)



def main():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "equivalence"))
    from compare_runs import run_arguments
    args = run_arguments(__doc__).parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    ref, work = os.path.join(args.out, "uninterrupted"), os.path.join(args.out, "interrupted")
    ck = os.path.join(work, "checkpoints")
    checks = []

    res = run(args, ref, [])
    checks.append(("uninterrupted run", res.returncode == 0))
    # 1. The state after 3 steps of the same 8-step schedule: the uninterrupted run's step-3 file.
    shutil.copytree(os.path.join(ref, "checkpoints"), ck, ignore=shutil.ignore_patterns("step-00000006.h5"))
    with open(os.path.join(ck, "latest"), "w") as f:
        f.write("step-00000003.h5\n")
    before = open(os.path.join(ck, "step-00000003.h5"), "rb").read()
    # 2. The save of step 6 dies half-way.
    res = run(args, work, [], kill_at=6)
    checks.append(("a rank killed mid-save (the job fails)", res.returncode != 0))
    checks.append(("a partial step-6 file was left", os.path.exists(os.path.join(ck, "step-00000006.h5.tmp"))))
    checks.append(("no published step 6", not os.path.exists(os.path.join(ck, "step-00000006.h5"))))
    checks.append(("latest still names step 3", open(os.path.join(ck, "latest")).read().strip() == "step-00000003.h5"))
    checks.append(("step 3 unchanged", open(os.path.join(ck, "step-00000003.h5"), "rb").read() == before))
    # 3. Resume from step 3 to the end.
    res = run(args, work, [])
    checks.append(("resumed run succeeds", res.returncode == 0))
    if res.returncode == 0:
        a, b = losses(ref), losses(work)
        checks.append(("losses after step 3 bitwise equal", all(a[s] == b[s] for s in range(4, 9))))
        checks.append(("final parameters bitwise equal", same_final_params(ref, work)))
    report(checks, res.stdout[-3000:] + res.stderr[-3000:])


if __name__ == "__main__":
    main()
