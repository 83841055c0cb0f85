#!/usr/bin/env python3
"""`meshtrain ckpt export` loaded by Hugging Face transformers itself (the library users load
exports with), in float32: for a Llama model (grouped-query attention, Llama 3.1 RoPE scaling)
and a Qwen3 model (q/k norm, tied embeddings), train 6 steps on one CPU rank saving at step 6,
export the checkpoint, compute meshtrain's loss on a batch with those weights (`dump_grads
--checkpoint`), load the export with AutoModelForCausalLM.from_pretrained in float32
and compute the mean next-token cross-entropy of the same batch. The two losses must agree to
--tol relative (1e-5). validation/check_export.py checks the same exports against an independent
float64 model without transformers; this script needs transformers, which Debian does not
package: it runs where transformers is installed (scripts/gpu-session.sh, step export).

Exits 77 when transformers cannot be imported.

usage: check_export_transformers.py --meshtrain BIN --dump-grads BIN --data H5 --out DIR [--tol 1e-5]
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DECK = os.path.join(ROOT, "tests", "equivalence", "tiny.toml")
MODELS = {
    "llama_gqa_rope_scaling": ["--model.use_rope_scaling=true", "--model.rope_original_max_seq_len=16",
                               "--model.rope_scaling_factor=4"],
    "qwen3_qk_norm_tied": ["--model.name=qwen3", "--model.flavor=debugmodel", "--model.qk_norm=true",
                           "--model.tie_word_embeddings=true", "--model.head_dim=16", "--model.ffn_hidden_dim=128"],
}


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stdout[-3000:], end="")
    if res.returncode:
        sys.exit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--dump-grads", dest="dump_grads", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    try:
        import h5py
        import torch
        import transformers
    except ImportError as e:
        print(f"SKIPPED: {e}")
        sys.exit(77)
    shutil.rmtree(a.out, ignore_errors=True)
    worst = 0.0
    for name, extra in MODELS.items():
        folder = os.path.join(a.out, name)
        run([a.meshtrain, "train", "--deck", DECK, f"--training.dataset={a.data}", f"--job.dump_folder={folder}",
             "--training.steps=6", "--checkpoint.enable=true", "--checkpoint.interval=6", "--training.device=cpu"]
            + extra)
        ck = os.path.join(folder, "checkpoints", "step-00000006.h5")
        hf = os.path.join(a.out, name + "_hf")
        run([a.meshtrain, "ckpt", "export", "--format", "safetensors", "--output", hf, ck])
        dump = os.path.join(a.out, name + "_loss.h5")
        run([a.dump_grads, dump, "--checkpoint", ck])
        with h5py.File(dump) as f:
            tokens = torch.as_tensor(f["batch"]["tokens"][()], dtype=torch.long)  # [B, T + 1]
            want = float(f.attrs["loss"])
        try:  # transformers 4.56 renamed torch_dtype to dtype
            model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
        model = model.float().eval()
        with torch.no_grad():
            logits = model(input_ids=tokens[:, :-1]).logits.float()
        got = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).item()
        err = abs(got - want) / abs(want)
        worst = max(worst, err)
        print(f"{name}: {type(model).__name__} (transformers {transformers.__version__}) loss {got:.8f} vs "
              f"meshtrain {want:.8f}, relative error {err:.2e}")
    if worst > a.tol:
        sys.exit(f"FAIL: relative error {worst:.2e} > {a.tol:g}")
    print(f"ok: transformers reproduces meshtrain's loss on every export (worst {worst:.2e} <= {a.tol:g})")


if __name__ == "__main__":
    main()
