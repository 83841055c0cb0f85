#!/usr/bin/env python3
"""meshtrain plan's rankings on one node against what published runs on such nodes find: plain
FSDP (or HSDP) is fastest for a model that fits it, every layout adding tp or cp is slower, and a
model too large for FSDP alone at its sequence takes tensor parallelism, not context parallelism.

  1. Llama 3 8B on 8 H100 SXM and on 8 GB200, seq_len 8192, global batch 16: the recommended
     layout has no tp, pp or cp, and the best layout of every family with tp or cp is predicted
     slower than the best without them (printed: by how much).
  2. Qwen3 32B on 8 GB200, seq_len 4096: the recommended layout has tp >= 2.
  3. Every recommended layout within the error band of the fastest is marked so, and the
     recommendation leads with such a layout (ties are ordered by simplicity).

The catalog's own entries (meshtrain's measured efficiency on its H100 step); nothing is held
fixed except the sequence and the global batch.

usage: node_rankings.py --meshtrain BIN --inputs DIR --out DIR
"""
import argparse
import json
import os
import subprocess
import sys


def plan(a, tag, deck, gpus, hardware, over):
    js = os.path.join(a.out, tag + ".json")
    cmd = [a.meshtrain, "plan", "--deck", os.path.join(a.inputs, deck), "--gpus", str(gpus), "--top", "5",
           "--json", js, "--hardware", hardware] + over
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{tag}: meshtrain plan failed\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return json.load(open(js))


def describe(c):
    return f"{c['family']} ({c['knobs']}) {c['tokens_per_s_per_device']:.0f} tokens/s/GPU"


def model_parallel(c):
    return c["tp"] > 1 or c["pp"] > 1 or c.get("cp", 1) > 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    failed = []

    for hw in ("h100_sxm", "gb200"):
        tag = f"8b_8_{hw}"
        r = plan(a, tag, "llama3_8b_fsdp8.toml", 8, hw, ["--training.seq_len=8192", "--training.global_batch_size=16"])
        best = r["top"][0]
        fams = r["best_per_family"]
        plain = [f for f in fams if not model_parallel(f)]
        print(f"8B on 8 {hw}, seq 8192: recommended {describe(best)}")
        if model_parallel(best):
            failed.append(f"{tag}: the recommended layout has tp, pp or cp ({best['family']})")
        if not plain:
            failed.append(f"{tag}: no layout without tp, pp or cp fits")
            continue
        for dim in ("tp", "cp"):
            with_dim = [f for f in fams if f.get(dim, 1) > 1]  # best first
            if not with_dim:
                continue
            f = with_dim[0]
            slower = 1 - f["tokens_per_s_per_device"] / plain[0]["tokens_per_s_per_device"]
            print(f"  fastest with {dim}: {describe(f)}, {slower:.1%} slower than {plain[0]['family']}"
                  f"{' (within error)' if f['within_error'] else ''}; {len(with_dim)} families with {dim}")
            if slower <= 0:
                failed.append(f"{tag}: {f['family']} predicted no slower than {plain[0]['family']}")

    r = plan(a, "32b_8_gb200", "qwen3_32b_tp2_fsdp4.toml", 8, "gb200", ["--training.seq_len=4096"])
    best = r["top"][0]
    print(f"32B on 8 gb200, seq 4096: recommended {describe(best)}")
    if best["tp"] < 2:
        failed.append(f"32b_8_gb200: the recommended layout has tp {best['tp']}")

    for tag in ("8b_8_h100_sxm", "8b_8_gb200", "32b_8_gb200"):
        r = json.load(open(os.path.join(a.out, tag + ".json")))
        fastest = r["fastest"][0]["tokens_per_s_per_device"]
        for c in r["top"]:
            inside = c["tokens_per_s_per_device"] >= fastest * (1 - r["error_band"])
            if c["within_error"] != inside:
                failed.append(f"{tag}: {c['family']} marked within_error={c['within_error']} at "
                              f"{c['tokens_per_s_per_device']:.0f} against the fastest {fastest:.0f} "
                              f"(band ±{r['error_band']:.0%})")
        if not r["top"][0]["within_error"]:
            failed.append(f"{tag}: the recommendation does not lead with a layout within the band")
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print("one-node rankings hold: FSDP for 8B at seq 8192 on H100 and GB200, tp >= 2 for 32B on GB200")


if __name__ == "__main__":
    main()
