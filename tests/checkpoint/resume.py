#!/usr/bin/env python3
"""Checkpoint resume tests through the real binary.

1. An uninterrupted run of --steps steps on the reference layout saves checkpoints every --at
   steps. 2. For each --layout "NAME NP [overrides]", a new run folder receives only the
   reference's step --at checkpoint (and a `latest` naming it), and trains to --steps on that
   layout, resuming by itself. Checks, against the uninterrupted run:
   - exact: the layout equal to the reference's must reproduce every loss after the resume point,
     the gradient norms and the final parameters bit for bit;
   - elastic (every other layout): within --tol (losses, gradient norms relative; parameters per
     tensor relative in the 2-norm) — the loader re-splits its global cursor, so a skipped or
     repeated sample would show as a loss jump far above it.

usage: resume.py --meshtrain BIN --deck DECK --data H5 --out DIR --steps 10 --at 5
                 --reference "NAME NP [overrides]" --layout "NAME NP [overrides]" ... [-- overrides]
"""
import json
import os
import shutil
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "equivalence"))
from compare_runs import launch, rel_l2, run_arguments  # noqa: E402

sys.dont_write_bytecode = True


def records(folder):
    recs = [json.loads(l) for l in open(os.path.join(folder, "metrics.jsonl"))]
    train = {r["step"]: r for r in recs if "loss" in r}
    return train


def params(folder):
    with h5py.File(os.path.join(folder, "model_final.h5"), "r") as f:
        return {k: f["model"][k][()] for k in f["model"]}


def main():
    p = run_arguments(__doc__)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--at", type=int, required=True, help="resume from the checkpoint of this step")
    p.add_argument("--reference", required=True, help='"NAME NP [--section.key=value ...]"')
    p.add_argument("--layout", action="append", default=[])
    p.add_argument("--tol", type=float, default=1e-5)
    args = p.parse_args()
    ck = [f"--checkpoint.enable=true", f"--checkpoint.interval={args.at}", f"--training.steps={args.steps}",
          "--metrics.log_freq=1"]
    args.extra = args.extra + ck
    ref_name, ref_np, *ref_over = args.reference.split()
    # A folder with checkpoints resumes from them: every run here starts from an empty one.
    shutil.rmtree(os.path.join(args.out, ref_name), ignore_errors=True)
    ref_dir = launch(args, int(ref_np), ref_name, ref_over)
    ref_recs, ref_params = records(ref_dir), params(ref_dir)
    saved = os.path.join(ref_dir, "checkpoints", f"step-{args.at:08d}.h5")
    if not os.path.exists(saved):
        sys.exit(f"FAIL: the reference saved no {saved}")
    failed = False
    for spec in [args.reference] + args.layout:
        name, n, *over = spec.split()
        tag = f"resume_{name}"
        folder = os.path.join(args.out, tag)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(os.path.join(folder, "checkpoints"))
        shutil.copy(saved, os.path.join(folder, "checkpoints"))
        with open(os.path.join(folder, "checkpoints", "latest"), "w") as f:
            f.write(os.path.basename(saved) + "\n")
        launch(args, int(n), tag, over)
        cur_recs, cur_params = records(folder), params(folder)
        steps = list(range(args.at + 1, args.steps + 1))
        if sorted(cur_recs) != steps:
            print(f"{name}: FAIL: resumed run logged steps {sorted(cur_recs)}, expected {steps}")
            failed = True
            continue
        exact = spec == args.reference
        if exact:
            same = (all(cur_recs[s]["loss"] == ref_recs[s]["loss"] and cur_recs[s]["grad_norm"] == ref_recs[s]["grad_norm"]
                        for s in steps)
                    and all(np.array_equal(cur_params[k], ref_params[k]) for k in ref_params))
            failed |= not same
            print(f"{name} ({n} ranks, same layout): losses, grad norms, final params "
                  f"{'bitwise identical' if same else 'FAIL: differ'} after resuming at step {args.at}")
            continue
        e_loss = max(abs(cur_recs[s]["loss"] - ref_recs[s]["loss"]) / abs(ref_recs[s]["loss"]) for s in steps)
        e_norm = max(abs(cur_recs[s]["grad_norm"] - ref_recs[s]["grad_norm"]) / ref_recs[s]["grad_norm"] for s in steps)
        e_par = max(rel_l2(ref_params[k], cur_params[k]) for k in ref_params)
        ok = e_loss <= args.tol and e_norm <= args.tol and e_par <= args.tol
        failed |= not ok
        print(f"{name} ({n} ranks, elastic): loss rel err {e_loss:.2e}, grad_norm rel err {e_norm:.2e}, "
              f"final params rel err {e_par:.2e} (2-norm) -> {'ok' if ok else 'FAIL'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
