#!/usr/bin/env python3
"""perf/ncu_kernel_table: meshtrain's GPU time by kernel, from Nsight Compute.

The development GPU machines have ncu but no usable nsys, so the per-kernel breakdown of a
training step comes from `ncu --metrics gpu__time_duration.sum` (one counter: one pass per
kernel, no replay of the kernel's memory) over a short `meshtrain train` run. Kernels are
serialized under ncu and the clocks left alone (--clock-control none), so each duration is the
kernel's own time on an otherwise idle GPU; launch gaps and overlap are not in it.

usage: ncu_kernel_table.py --csv NCU.csv [--last-step | --skip-launches N] [--top 25] [--json OUT.json]
  NCU.csv:  the output of
            ncu --csv --print-units base --clock-control none --print-kernel-base demangled \
                --metrics gpu__time_duration.sum meshtrain train ...
            (--print-kernel-base function works too, without the split below)
  --last-step: keep only the last whole training step. A step ends with the optimizer's
            launches (kernels named adamw*); the launches after the second-to-last such group
            up to the end of the last one form the last step (needs a run of >= 2 steps).
  --skip-launches N: leave out the first N kernel launches (initialization, the first step).
Prints one line per kernel name (launches, total ms, share of the total, mean µs), largest
first, and writes the same as JSON. A kernel is named by its function's base name (template
instances merged); meshtrain's generic element-wise kernel (flat_kernel, which runs casts,
scales, adds, fills, SwiGLU and AdamW) is split by the operation it ran, read from a demangled
name's template arguments: "flat_kernel (ScaleOp)".
"""
import argparse
import collections
import csv
import glob
import io
import json
import os
import re
import sys


def read_rows(path):
    """The CSV rows of the ncu output (ncu prints its own log lines before the header)."""
    if not os.path.exists(path):  # ncu may add its own suffix to --log-file's name
        found = sorted(glob.glob(path + "*"))
        if not found:
            sys.exit(f"{path}: no such file (the ncu run wrote no log)")
        path = found[0]
    with open(path, errors="replace") as f:
        text = f.read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV header (\"ID\", ...) found: was ncu run with --csv?")
    return list(csv.DictReader(io.StringIO(text[start:])))


# Kernels whose template arguments say what they computed: split by their operation type.
GENERIC_KERNELS = {"flat_kernel"}


def kernel_label(name):
    """The table's name for a kernel name as ncu prints it (function base name or demangled).

    "void meshtrain::cuda::flat_kernel<4, meshtrain::(anonymous namespace)::ScaleOp<float>>(long, ...)"
    gives "flat_kernel (ScaleOp)"; other demangled names their base name ("attn_fwd_tc"); a
    name without template or parameter list (cuBLAS's nvjet_*, ncu's function base) itself.
    """
    text = name.strip().replace("(anonymous namespace)", "{anonymous}")  # no parenthesis to cut at
    if text.startswith("void "):
        text = text[5:]
    cut = min([i for i in (text.find("<"), text.find("(")) if i >= 0], default=len(text))
    base = text[:cut].split("::")[-1].strip() or text
    if base not in GENERIC_KERNELS or not text[cut:].startswith("<"):
        return base
    depth, end = 0, cut
    for end in range(cut, len(text)):
        depth += {"<": 1, ">": -1}.get(text[end], 0)
        if depth == 0:
            break
    args = text[cut + 1:end]
    # The operation is the last template argument: a (possibly namespaced, templated) type.
    op = re.split(r",\s*(?![^<]*>)", args)[-1]
    op = op.split("<")[0].split("::")[-1].strip()
    return f"{base} ({op})" if op and not op.isdigit() else base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", required=True)
    ap.add_argument("--skip-launches", type=int, default=0)
    ap.add_argument("--last-step", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    a = ap.parse_args()

    rows = [r for r in read_rows(a.csv) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if not rows:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows")
    name_of = {int(r["ID"]): r["Kernel Name"] for r in rows}
    ids = sorted(name_of)
    if a.last_step:
        ends = [i for n, i in enumerate(ids) if "adamw" in name_of[i].lower() and
                (n + 1 == len(ids) or "adamw" not in name_of[ids[n + 1]].lower())]
        if len(ends) < 2:
            sys.exit(f"{a.csv}: {len(ends)} optimizer step(s) found; --last-step needs a run of at least 2 steps")
        keep = {i for i in ids if ends[-2] < i <= ends[-1]}
        a.skip_launches = sum(1 for i in ids if i <= ends[-2])
        print(f"{len(ends)} training steps found; the last one kept")
    else:
        keep = set(ids[a.skip_launches:])
    total = collections.Counter()
    count = collections.Counter()
    for r in rows:
        if int(r["ID"]) not in keep:
            continue
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1.0)
        v = float(r["Metric Value"].replace(",", "")) * scale
        name = kernel_label(r["Kernel Name"])
        total[name] += v
        count[name] += 1
    grand = sum(total.values())
    top = []
    print(f"{len(keep)} kernel launches after skipping {a.skip_launches}; GPU time {grand / 1e6:.2f} ms")
    print(f"{'kernel':<60} {'launches':>8} {'total ms':>9} {'share':>6} {'mean us':>8}")
    for name, t in total.most_common(a.top):
        share = t / grand if grand else 0.0
        print(f"{name[:60]:<60} {count[name]:>8} {t / 1e6:>9.3f} {share:>6.1%} {t / count[name] / 1e3:>8.1f}")
        top.append({"kernel": name, "launches": count[name], "total_ms": t / 1e6, "share": share,
                    "mean_us": t / count[name] / 1e3})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"launches": len(keep), "skipped": a.skip_launches, "gpu_time_ms": grand / 1e6, "top": top},
                      f, indent=1)


if __name__ == "__main__":
    main()
