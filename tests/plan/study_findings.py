#!/usr/bin/env python3
"""meshtrain plan against the qualitative findings of the configuration study (the benchmark
of thousands of data / tensor / pipeline layouts on H100 nodes: seq_len 4096, global batch 1M
tokens = 256 samples, DP x TP x PP with ZeRO, no context parallelism):

  1. Llama 3 8B on 8 H100: FSDP alone beats every layout with tensor parallelism;
  2. pipeline parallelism enters only when layouts without it cannot fit or cannot hide their
     data-parallel communication (the study's decision algorithm: TP inside the node, then DP,
     then PP "when DP communication saturates", worth it while the bubble (D_PP - 1)/m ·
     T_compute costs less than the DP communication it removes): for 8B on 8, 70B on 32 and
     405B on 128 and 512 H100, whenever the fastest layout has pp > 1, the same search with pp
     held at 1 and the same activation checkpointing (mode and N: recomputing more is another
     way not to fit) finds nothing that fits, or its fastest layout exposes more data-parallel
     communication than the pipeline's bubble and transfers cost;
  3. 70B on 32 GPUs needs TP: without tensor (or pipeline) parallelism nothing fits unless
     every block is recomputed (the study's memory wall), and the recommended layout has tp > 1
     unless a layout without it, recomputing every block, ties with the best TP layout within
     the model's error band (ties are ordered by simplicity).

usage: study_findings.py --meshtrain BIN --inputs DIR --out DIR
"""
import argparse
import json
import os
import subprocess
import sys

# The study measured PyTorch-based systems: its H100s run at their efficiency
# (inputs/hardware/h100_torchtitan_eager.toml), not meshtrain's faster one (the catalog's h100_sxm).
STUDY = ["--training.seq_len=4096", "--training.global_batch_size=256", "--fixed",
         "parallelism.context_parallel_degree"]
HARDWARE = os.path.join("hardware", "h100_torchtitan_eager.toml")


def plan(a, tag, deck, gpus, extra=()):
    js = os.path.join(a.out, tag + ".json")
    cmd = [a.meshtrain, "plan", "--deck", os.path.join(a.inputs, deck), "--gpus", str(gpus), "--top", "1",
           "--json", js, "--hardware", os.path.join(a.inputs, HARDWARE)] + STUDY + list(extra)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{tag}: meshtrain plan failed\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return json.load(open(js))


def held(a, tag, deck, gpus, keys):
    """The study's search with `keys` ({deck key: value}) held as well as cp."""
    js = os.path.join(a.out, tag + ".json")
    fixed = ",".join(["parallelism.context_parallel_degree"] + [k for k in keys if k != "activation_checkpoint.selective_ac_option"])
    cmd = [a.meshtrain, "plan", "--deck", os.path.join(a.inputs, deck), "--gpus", str(gpus), "--top", "1",
           "--json", js, "--training.seq_len=4096", "--training.global_batch_size=256", "--hardware", "h100_sxm",
           "--fixed", fixed] + [f"--{k}={v}" for k, v in keys.items()]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{tag}: meshtrain plan failed\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return json.load(open(js))


def ac_keys(c):
    """The deck keys of a candidate's activation checkpointing."""
    k = c["deck_keys"]
    return {"activation_checkpoint.mode": k["activation_checkpoint.mode"].strip('"'),
            "activation_checkpoint.selective_ac_option": k["activation_checkpoint.selective_ac_option"].strip('"')}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    failed = []

    # 1. 8B on 8 H100.
    r = plan(a, "8b_8", "llama3_8b_fsdp8.toml", 8)
    best = r["top"][0]
    fams = r["best_per_family"]
    no_tp = [f for f in fams if f["tp"] == 1]
    with_tp = [f for f in fams if f["tp"] > 1]
    print(f"8B on 8: fastest {best['family']} ({best['knobs']}) at {best['tokens_per_s_per_device']:.0f} tokens/s/GPU; "
          f"best with TP: {with_tp[0]['family']} at {with_tp[0]['tokens_per_s_per_device']:.0f}")
    if best["tp"] != 1 or best["pp"] != 1 or not no_tp or not with_tp or \
            no_tp[0]["tokens_per_s_per_device"] <= with_tp[0]["tokens_per_s_per_device"]:
        failed.append("8B on 8: FSDP alone should beat every tensor-parallel layout")

    # 2. PP only when nothing without it fits.
    for tag, deck, gpus in (("8b_8", "llama3_8b_fsdp8.toml", 8), ("70b_32", "llama3_70b_tp4_fsdp8.toml", 32),
                            ("405b_128", "llama3_405b_fsdp8_tp8_pp8.toml", 128),
                            ("405b_512", "llama3_405b_fsdp8_tp8_pp8.toml", 512)):
        r = plan(a, tag, deck, gpus)
        if not r["top"]:
            print(f"{tag}: nothing fits ({r['valid']} valid layouts)")
            continue
        best = r["top"][0]
        if best["pp"] == 1:
            print(f"{tag}: fastest {best['family']} ({best['knobs']}), {best['tokens_per_s_per_device']:.1f} "
                  f"tokens/s/GPU, without pp")
            continue
        keys = {"parallelism.pipeline_parallel_degree": 1, **ac_keys(best)}
        flat = held(a, tag + "_pp1", deck, gpus, keys)
        print(f"{tag}: fastest {best['family']} ({best['knobs']}), {best['tokens_per_s_per_device']:.1f} "
              f"tokens/s/GPU; without pp at that recomputation {flat['fitting']} layouts fit")
        if flat["fitting"] > 0:
            other = flat["top"][0]
            dp_s = sum(c["exposed_s"] for c in other["comm"] if c["dim"] in ("fsdp", "efsdp", "dp_replicate"))
            pp_s = best["bubble_s"] + sum(c["exposed_s"] for c in best["comm"] if c["dim"] == "pp")
            print(f"  fastest without pp: {other['family']} ({other['knobs']}), "
                  f"{other['tokens_per_s_per_device']:.1f} tokens/s/GPU, data-parallel communication exposed "
                  f"{dp_s:.2f} s against the pipeline's bubble and transfers {pp_s:.2f} s")
            if dp_s <= pp_s:
                failed.append(f"{tag}: pp {best['pp']} chosen although {other['family']} fits with the same "
                              f"activation checkpointing and exposes no more data-parallel communication")

    # 3. 70B on 32 needs TP: the memory wall without it, and the fastest layout uses it.
    r = plan(a, "70b_32", "llama3_70b_tp4_fsdp8.toml", 32)
    best = r["top"][0]
    fams = r["best_per_family"]
    no_tp = [f for f in fams if f["tp"] == 1]
    print(f"70B on 32: fastest {best['family']} ({best['knobs']}) {best['tokens_per_s_per_device']:.0f} tokens/s/GPU; "
          f"best without TP: " + (f"{no_tp[0]['family']} ({no_tp[0]['knobs']}) {no_tp[0]['tokens_per_s_per_device']:.0f}"
                                  if no_tp else "none fits"))
    # Ties within the model's error band are ordered by simplicity (fewer model-parallel
    # dimensions first), so a layout without TP may lead the recommendation. It may only do so
    # as a tie with the best TP layout, and only at the memory wall's price: every block
    # recomputed.
    with_tp = [f for f in fams if f["tp"] > 1]
    if best["tp"] == 1:
        print(f"  recommended without TP as a tie (within ±{r['error_band']:.0%}): best with TP "
              f"{with_tp[0]['family']} ({with_tp[0]['knobs']}) {with_tp[0]['tokens_per_s_per_device']:.0f}"
              if with_tp else "  no TP layout fits")
        if not with_tp or not with_tp[0]["within_error"] or not best["within_error"] or "full AC" not in best["knobs"]:
            failed.append("70B on 32: a layout without tensor parallelism leads although no TP layout ties with it, "
                          "or it does not recompute every block")
    for mode in ("none", "selective"):
        wall = held(a, "70b_32_wall_" + mode, "llama3_70b_tp4_fsdp8.toml", 32,
                    {"parallelism.tensor_parallel_degree": 1, "parallelism.pipeline_parallel_degree": 1,
                     "activation_checkpoint.mode": mode, "activation_checkpoint.selective_ac_option": 2})
        least = min((c["least"]["memory_bytes"]["total"] for c in wall["rejected"]), default=0) / 2**30
        print(f"70B on 32 without TP or PP, AC {mode}: {wall['fitting']} of {wall['valid']} layouts fit "
              f"(the smallest needs {least:.1f} GiB)")
        if wall["fitting"] > 0:
            failed.append(f"70B on 32: {wall['fitting']} layouts without TP or PP fit with AC {mode}")
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print("the configuration study's findings 1, 2 and 3 hold")


if __name__ == "__main__":
    main()
