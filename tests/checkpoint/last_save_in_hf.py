#!/usr/bin/env python3
"""[checkpoint] last_save_in_hf and export_dtype: the last save of a 2-rank FSDP run is also a
Hugging Face folder (checkpoints/step-NNNNNNNN-hf) whose tensors are the model-only checkpoint's
float32 values rounded to bfloat16 as torch rounds them, bit for bit (config.json says bfloat16);
`ckpt export --dtype float16` gives numpy's float16 rounding of the float32 export; a deck asking
for the Hugging Face save without a model-only last save is refused with the key named.

usage: last_save_in_hf.py --meshtrain BIN --deck DECK --data H5 --out DIR
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import parse_run_args  # noqa: E402


def read_safetensors(path):
    """name -> (dtype string, shape, raw bytes)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def main():
    a = parse_run_args()
    run = os.path.join(a.out, "run")
    common = ["--deck", a.deck, f"--training.dataset={a.data}", "--training.steps=3", "--checkpoint.enable=true",
              "--checkpoint.interval=10", "--checkpoint.last_save_model_only=true", "--validation.enable=false"]
    r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", a.meshtrain, "train", *common,
                        "--checkpoint.last_save_in_hf=true", "--checkpoint.export_dtype=bfloat16",
                        f"--job.dump_folder={run}"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"training failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    checks = []
    hf = os.path.join(run, "checkpoints", "step-00000003-hf")
    cfg = json.load(open(os.path.join(hf, "config.json")))
    checks.append(("config.json torch_dtype is bfloat16", cfg["torch_dtype"] == "bfloat16"))
    f32_dir = os.path.join(a.out, "f32")
    subprocess.run([a.meshtrain, "ckpt", "export", "--format", "safetensors", "--output", f32_dir,
                    os.path.join(run, "checkpoints", "step-00000003.h5")], check=True, capture_output=True)
    bf = read_safetensors(os.path.join(hf, "model.safetensors"))
    f32 = read_safetensors(os.path.join(f32_dir, "model.safetensors"))
    same = set(bf) == set(f32) and all(bf[k][0] == "BF16" and bf[k][1] == f32[k][1] for k in bf)
    checks.append((f"{len(bf)} tensors, all BF16 with the float32 export's names and shapes", same))
    exact = all(
        torch.from_numpy(np.frombuffer(f32[k][2], dtype=np.float32).copy()).to(torch.bfloat16).view(torch.int16)
        .numpy().tobytes() == bf[k][2] for k in bf) if same else False
    checks.append(("bfloat16 values = torch's rounding of the float32 checkpoint, bit for bit", exact))
    f16_dir = os.path.join(a.out, "f16")
    subprocess.run([a.meshtrain, "ckpt", "export", "--format", "safetensors", "--dtype", "float16", "--output", f16_dir,
                    os.path.join(run, "checkpoints", "step-00000003.h5")], check=True, capture_output=True)
    f16 = read_safetensors(os.path.join(f16_dir, "model.safetensors"))
    exact16 = all(f16[k][0] == "F16" and np.frombuffer(f32[k][2], dtype=np.float32).astype(np.float16).tobytes() ==
                  f16[k][2] for k in f32)
    checks.append(("ckpt export --dtype float16 = numpy's float16 rounding, bit for bit", exact16))
    r = subprocess.run([a.meshtrain, "train", *common[:-2], "--checkpoint.last_save_model_only=false",
                        "--checkpoint.last_save_in_hf=true", f"--job.dump_folder={a.out}/refused"],
                       capture_output=True, text=True)
    checks.append(("last_save_in_hf without last_save_model_only refused (exit 2, key named)",
                   r.returncode == 2 and "[checkpoint] last_save_in_hf: needs" in r.stderr))
    for what, ok in checks:
        print(("ok   " if ok else "FAIL ") + what)
    sys.exit(0 if all(ok for _, ok in checks) else 1)


if __name__ == "__main__":
    main()
