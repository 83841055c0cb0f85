#!/usr/bin/env python3
"""Checks a meshtrain model dump against the independent PyTorch reference (llama_reference.py):
rebuilds the model in float64 from /params, computes the loss and every parameter gradient on
/batch/tokens, and compares with meshtrain's fp32 values. Relative error of a tensor is
max|ref - meshtrain| / max|ref|. Exits 1 if any error exceeds --tol or a parameter is missing.

usage: /usr/bin/python3 validation/check_gradients.py DUMP.h5 [--tol 1e-5]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_reference import LlamaReference, load_dump  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dump")
    p.add_argument("--tol", type=float, default=1e-5)
    args = p.parse_args()
    torch.set_num_threads(1)
    margs, params, grads, tokens, loss, buffers, force_balance = load_dump(args.dump, with_buffers=True)
    if grads is None or tokens is None or loss is None:
        sys.exit(f"{args.dump}: needs /grads, /batch/tokens and the loss attribute (write it with dump_grads)")
    import h5py

    with h5py.File(args.dump, "r") as f:  # dump_grads --block-causal: document masking's EOS id
        eos_id = int(f.attrs["doc_mask_eos_id"]) if "doc_mask_eos_id" in f.attrs else None
    ref = LlamaReference(margs, params, buffers=buffers, force_balance=force_balance)
    ref_loss = ref.loss(tokens, eos_id=eos_id)
    if eos_id is not None:
        print(f"document masking: EOS id {eos_id}, explicit [B, T, T] mask")
    ref_loss.backward()
    worst = abs(ref_loss.item() - loss) / abs(ref_loss.item())
    failed = worst > args.tol
    print(f"{'tensor':48} {'max|ref|':>12} {'rel err':>10}")
    print(f"{'loss':48} {abs(ref_loss.item()):12.6g} {worst:10.2e}")
    names = sorted(set(params) | set(grads))
    for name in names:
        if name not in grads or name not in ref.params:
            print(f"{name}: missing on one side")
            failed = True
            continue
        g_ref = ref.params[name].grad.numpy()
        g_mt = np.asarray(grads[name], dtype=np.float64)
        if g_ref.shape != g_mt.shape:
            print(f"{name}: shape {g_mt.shape} vs reference {g_ref.shape}")
            failed = True
            continue
        scale = max(np.max(np.abs(g_ref)), 1e-30)
        err = float(np.max(np.abs(g_ref - g_mt)) / scale)
        worst = max(worst, err)
        failed |= err > args.tol
        print(f"{name:48} {scale:12.6g} {err:10.2e}{'  FAIL' if err > args.tol else ''}")
    print(f"max relative error {worst:.2e} (tolerance {args.tol:g}): {'FAIL' if failed else 'ok'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
