#!/usr/bin/env python3
"""Reads a meshtrain sharded checkpoint with h5py alone (no meshtrain code) and checks it against
the final model of the same run at the same step (model_final.h5 of a run whose last step is the
checkpoint's: a model-only checkpoint, /model/<name>; an unsharded model dump, /params/<name>, is
read too): every /model/<name> dataset equal, bit for bit, to the final model's; every
/optimizer/<name>/{exp_avg, exp_avg_sq} present with the parameter's shape, exp_avg_sq >= 0 and
not all zero; /train_state's step equal to --step; /meta's format and version; /checksums lines
that name existing datasets. Exits 1 with the first mismatch.

usage: /usr/bin/python3 validation/check_checkpoint.py CHECKPOINT.h5 MODEL_FINAL.h5 --step N
"""
import argparse
import sys

import h5py
import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("dump")
    p.add_argument("--step", type=int, required=True)
    a = p.parse_args()
    errors = []
    with h5py.File(a.checkpoint, "r") as ck, h5py.File(a.dump, "r") as dump:
        meta = ck["meta"].attrs
        if meta["format"] != "meshtrain-checkpoint" or int(meta["format_version"]) != 1:
            errors.append(f"/meta: format {meta['format']!r} version {meta['format_version']}")
        if int(ck["train_state"].attrs["step"]) != a.step:
            errors.append(f"/train_state step {ck['train_state'].attrs['step']} != {a.step}")
        final = dump["model"] if "model" in dump else dump["params"]
        names = sorted(final)
        for name in names:
            want = final[name][()]
            got = ck["model"][name][()] if name in ck["model"] else None
            if got is None or got.dtype != np.float32 or not np.array_equal(got, want):
                errors.append(f"/model/{name} differs from the final model's {final.name}/{name}")
            for state in ("exp_avg", "exp_avg_sq"):
                path = f"optimizer/{name}/{state}"
                if path not in ck or ck[path].shape != want.shape:
                    errors.append(f"/{path} missing or of another shape")
                    continue
                v = ck[path][()]
                if not np.any(v) or (state == "exp_avg_sq" and np.any(v < 0)):
                    errors.append(f"/{path}: all zero or negative second moments")
        text = ck["checksums"][()].tobytes().decode()
        for line in text.splitlines():
            name = line.split("\t")[0]
            if name.lstrip("/") not in ck:
                errors.append(f"/checksums names {name}, which does not exist")
        print(f"{a.checkpoint}: {len(names)} parameters, {len(text.splitlines())} checksum records, "
              f"meta layout '{meta['layout']}'")
    for e in errors[:10]:
        print("FAIL", e)
    if errors:
        sys.exit(1)
    print("ok: every parameter equals the dump bit for bit; optimizer state and checksums present")


if __name__ == "__main__":
    main()
