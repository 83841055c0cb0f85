#!/usr/bin/env python3
"""check_block_causal_validation: meshtrain's validation loss under document masking
(`[model] attn_mask_type = "block_causal"`) on the WHOLE validation split, against the
independent PyTorch model (llama_reference.py) with an explicit [B, T, T] mask, in float64.

1. `meshtrain train` a small Llama 3 model for a few steps with block_causal (default seq_len
   2048 on data/brown.h5, validation over the whole split at the last step);
2. the reference rebuilds the model from model_final.h5 (the weights that validation used; the
   shape from `meshtrain model info --deck` on the resolved deck stored in the file) and computes
   the mean cross-entropy over every validation sample as meshtrain's loader cuts them (window i
   = tokens [i·T, i·T + T] of the split, i < (n − 1) // T), masking each query to the earlier
   tokens of its own document (a document ends with, and includes, its EOS token);
3. it also computes the plain causal loss of the same weights, to show that the split's document
   boundaries move the loss by far more than the tolerance.

Exit 0 when |meshtrain − reference| / |reference| ≤ --tol (default 1e-5), 1 otherwise.

usage: /usr/bin/python3 validation/check_block_causal_validation.py --meshtrain build/bin/meshtrain
           [--data data/brown.h5] [--out DIR] [--seq-len 2048] [--steps 20] [--tol 1e-5]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_reference import ARG_NAMES, LlamaReference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd):
    """stdout of cmd; exits with the tail of its output when it fails."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"{' '.join(cmd)} failed ({e.returncode}):\n{e.stdout[-3000:]}\n{e.stderr[-3000:]}")


def train(args):
    """Runs meshtrain and returns (validation loss at the last step, model_final.h5 path)."""
    dump = os.path.join(args.out, "run")
    with h5py.File(args.data, "r") as f:
        vocab = int(f.attrs["vocab_size"])
    cmd = [args.meshtrain, "train", "--deck", os.path.join(ROOT, "inputs/llama3_debug.toml"),
           f"--training.dataset={args.data}", f"--job.dump_folder={dump}", f"--training.steps={args.steps}",
           f"--training.seq_len={args.seq_len}", f"--training.local_batch_size={args.batch}",
           f"--training.global_batch_size={args.batch}", f"--model.dim={args.dim}",
           f"--model.n_layers={args.n_layers}", f"--model.n_heads={args.n_heads}",
           f"--model.n_kv_heads={args.n_kv_heads}", f"--model.vocab_size={vocab}",
           "--model.attn_mask_type=block_causal",
           "--lr_scheduler.warmup_steps=2", "--validation.enable=true", f"--validation.freq={args.steps}",
           "--validation.steps=-1", "--metrics.log_freq=1", "--checkpoint.enable=false"]
    if args.mpirun:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", "--bind-to", "none"] + cmd
    sh(cmd)
    val = None
    for line in open(os.path.join(dump, "metrics.jsonl")):
        rec = json.loads(line)
        if "val_loss" in rec:
            val = float(rec["val_loss"])
    if val is None:
        sys.exit(f"{dump}/metrics.jsonl: no val_loss record")
    return val, os.path.join(dump, "model_final.h5")


def load_model(args, path):
    """(args dict of llama_reference, params) from a model-only checkpoint."""
    with h5py.File(path, "r") as f:
        deck = f["meta"].attrs["deck"]
        deck = deck.decode() if isinstance(deck, bytes) else deck
        params = {k: f["model"][k][()] for k in f["model"]}
    deck_path = os.path.join(args.out, "resolved_deck.toml")
    with open(deck_path, "w") as f:
        f.write(deck)
    info = json.loads(sh([args.meshtrain, "model", "info", "--deck", deck_path, "--json"]))
    return {k: info[k] for k in ARG_NAMES}, params


def windows(data, seq_len):
    """The validation samples [N, T + 1] as meshtrain's loader cuts them (in order), and eos_id."""
    with h5py.File(data, "r") as f:
        tokens = np.asarray(f["validation/tokens"][:]).astype(np.int64)
        eos = int(f.attrs["eos_id"])
    n = (len(tokens) - 1) // seq_len
    return np.stack([tokens[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]), eos


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--meshtrain", default=os.path.join(ROOT, "build/bin/meshtrain"))
    p.add_argument("--data", default=os.path.join(ROOT, "data/brown.h5"))
    p.add_argument("--out", default="/tmp/block_causal_validation")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-kv-heads", type=int, default=2)
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--mpirun", action="store_true", help="launch meshtrain under mpirun -np 1")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    t0 = time.time()
    val, model_path = train(args)
    t_train = time.time() - t0
    margs, params = load_model(args, model_path)
    samples, eos = windows(args.data, args.seq_len)
    ref = LlamaReference(margs, params, dtype=torch.float64)
    sums = {"block_causal": 0.0, "causal": 0.0}
    docs = 0
    t1 = time.time()
    with torch.no_grad():
        for s in samples:
            batch = s[None, :]
            docs += 1 + int((s[:-1] == eos).sum())
            for name, e in (("block_causal", eos), ("causal", None)):
                # loss() is the mean over the sample's T targets; every sample has T of them.
                sums[name] += float(ref.loss(batch, eos_id=e)) * args.seq_len
    count = len(samples) * args.seq_len
    ref_block, ref_causal = sums["block_causal"] / count, sums["causal"] / count
    err = abs(val - ref_block) / abs(ref_block)
    print(f"validation split of {os.path.relpath(args.data, ROOT) if args.data.startswith(ROOT) else args.data}: "
          f"{len(samples)} samples of {args.seq_len} ({count} targets), {docs} document pieces, eos {eos}")
    print(f"model: dim {margs['dim']}, {margs['n_layers']} layers, {margs['n_heads']} heads / "
          f"{margs['n_kv_heads']} kv, after {args.steps} block_causal steps (train {t_train:.0f} s, "
          f"reference {time.time() - t1:.0f} s)")
    print(f"meshtrain val_loss (block_causal)      {val:.9f}")
    print(f"reference float64, explicit doc mask   {ref_block:.9f}   rel err {err:.2e} (tol {args.tol:g})")
    print(f"reference float64, causal only         {ref_causal:.9f}   differs by "
          f"{abs(ref_causal - ref_block) / abs(ref_block):.2e}")
    if not math.isfinite(err) or err > args.tol:
        print("FAIL: meshtrain's block_causal validation loss does not match the reference")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
