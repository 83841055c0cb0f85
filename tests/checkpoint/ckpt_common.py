"""Helpers shared by the checkpoint tests: a run folder's losses and final parameters, and the
ok/FAIL report."""
import json
import os
import sys

import h5py
import numpy as np


def losses(folder):
    """{step: loss} of the training records of folder/metrics.jsonl."""
    return {r["step"]: r["loss"] for r in map(json.loads, open(os.path.join(folder, "metrics.jsonl"))) if "loss" in r}


def same_final_params(a, b):
    """Whether a/model_final.h5 and b/model_final.h5 hold bitwise identical parameters."""
    with h5py.File(os.path.join(a, "model_final.h5")) as f, h5py.File(os.path.join(b, "model_final.h5")) as g:
        return set(f["model"]) == set(g["model"]) and all(
            np.array_equal(f["model"][k][()], g["model"][k][()]) for k in f["model"])


def report(checks, context):
    """Prints each (name, ok) check; on any failure prints `context` (run output) and exits 1."""
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not all(ok for _, ok in checks):
        print(context)
        sys.exit(1)


def parse_run_args(names=("meshtrain", "deck", "data", "out")):
    """The usual --meshtrain/--deck/--data/--out arguments (all required); --out is emptied."""
    import argparse
    import shutil
    ap = argparse.ArgumentParser()
    for k in names:
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    return a
