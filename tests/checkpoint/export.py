#!/usr/bin/env python3
"""Export and model-only checkpoints through the real binaries (4 ranks, TP 2 x FSDP 2).

For a Llama model (GQA, Llama 3.1 RoPE scaling), a Qwen3 model (q/k norm, tied embeddings), a
Qwen3-MoE model and a Mixtral model:
train 6 steps saving at 3 and 6; `meshtrain ckpt export --format safetensors` the step-6 file;
`dump_grads --checkpoint` computes meshtrain's loss on a batch with those weights; and
validation/check_export.py (PyTorch, Hugging Face layout, no meshtrain code) reproduces it to
1e-5 and shows the q/k permutation matters on that batch.

The Llama run sets [checkpoint] last_save_model_only: its step-6 file has no /optimizer, `ckpt
inspect` says so, resuming from it is refused with one line, and load_step = 3 resumes. Also
refused with status 2: resuming with another [training] seed, exporting a checkpoint with a
flipped byte (nothing is left under the output folder's final names), exporting a MoE model whose
expert-selection bias moved, an unknown --format.

usage: export.py --meshtrain BIN --dump-grads BIN --deck DECK --data H5 --out DIR
"""
import argparse
import os
import shutil
import subprocess
import sys

import h5py

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import report  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "..", "..", "validation", "check_export.py")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

MODELS = {
    "llama_gqa_rope_scaling": ["--model.use_rope_scaling=true", "--model.rope_original_max_seq_len=16",
                               "--model.rope_scaling_factor=4", "--checkpoint.last_save_model_only=true"],
    "qwen3_qk_norm_tied": ["--model.name=qwen3", "--model.flavor=debugmodel", "--model.qk_norm=true",
                           "--model.tie_word_embeddings=true", "--model.head_dim=16", "--model.ffn_hidden_dim=128"],
    # Qwen3-MoE (blocks 1 and 3 sparse: decoder_sparse_step 2; renormalized top-2 of 4) and
    # Mixtral (every block MoE, top-2 of 4); no selection bias (Hugging Face's routers have none).
    "qwen3_moe": ["--model.name=qwen3", "--model.flavor=debugmodel", "--model.head_dim=16",
                  "--model.ffn_hidden_dim=128", "--model.n_layers=4", "--model.num_experts=4", "--model.top_k=2",
                  "--model.moe_inter_dim=48", "--model.route_norm=true", "--model.moe_layer_step=2",
                  "--model.load_balance_coeff=0"],
    "mixtral": ["--model.name=mixtral", "--model.flavor=debugmodel", "--model.n_layers=2", "--model.num_experts=4",
                "--model.moe_inter_dim=48", "--model.load_balance_coeff=0"],
}


def train(a, folder, extra):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", a.meshtrain, "train", "--deck", a.deck,
           f"--training.dataset={a.data}", f"--job.dump_folder={folder}", "--checkpoint.enable=true",
           "--checkpoint.interval=3", "--parallelism.tensor_parallel_degree=2"] + extra
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True)


def run(cmd):
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True)


def one_error(res, *words):
    lines = [l for l in (res.stdout + res.stderr).splitlines() if "error:" in l]
    return res.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k in ("meshtrain", "dump_grads", "deck", "data", "out"):
        p.add_argument("--" + k.replace("_", "-"), dest=k, required=True)
    a = p.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    checks, context = [], ""
    for name, extra in MODELS.items():
        folder = os.path.join(a.out, name)
        res = train(a, folder, ["--training.steps=6"] + extra)
        context += res.stdout[-2000:] + res.stderr[-2000:]
        if res.returncode != 0:
            report([(f"{name}: training run", False)], context)
        ck = os.path.join(folder, "checkpoints", "step-00000006.h5")
        hf = os.path.join(a.out, name + "_hf")
        exp = run([a.meshtrain, "ckpt", "export", "--format", "safetensors", "--output", hf, ck])
        dump = os.path.join(a.out, name + "_loss.h5")
        dg = run([a.dump_grads, dump, "--checkpoint", ck])
        chk = run([sys.executable, CHECK, hf, dump, "--tol", "1e-5", "--require-sensitive"])
        print(exp.stdout + dg.stdout + chk.stdout, end="")
        context += exp.stderr + dg.stderr + chk.stderr
        checks.append((f"{name}: export, meshtrain loss, PyTorch (HF layout) loss within 1e-5",
                       exp.returncode == 0 and dg.returncode == 0 and chk.returncode == 0))

    llama = os.path.join(a.out, "llama_gqa_rope_scaling")
    ck6 = os.path.join(llama, "checkpoints", "step-00000006.h5")
    with h5py.File(ck6) as f:
        checks.append(("the model-only save has /model and no /optimizer", "model" in f and "optimizer" not in f))
    with h5py.File(os.path.join(llama, "checkpoints", "step-00000003.h5")) as f:
        checks.append(("the interval save before it is complete", "optimizer" in f))
    ins = run([a.meshtrain, "ckpt", "inspect", ck6])
    checks.append(("ckpt inspect reports model only", ins.returncode == 0 and "model only" in ins.stdout))
    base = MODELS["llama_gqa_rope_scaling"]
    res = train(a, llama, ["--training.steps=8"] + base)
    checks.append(("resuming from the model-only checkpoint is refused with one line", one_error(res, ck6, "model-only")))
    res = train(a, os.path.join(a.out, "llama_gqa_rope_scaling"), ["--training.steps=8", "--training.seed=8",
                                                                    "--checkpoint.load_step=3"] + base)
    checks.append(("resuming with another seed is refused with one line", one_error(res, "seed 7", "the deck has 8")))
    res = train(a, llama, ["--training.steps=8", "--checkpoint.load_step=3"] + base)
    checks.append(("load_step = 3 resumes past the model-only save", res.returncode == 0 and "resumed from" in res.stdout + res.stderr))
    context += res.stderr[-2000:]

    bad = os.path.join(a.out, "flipped.h5")
    shutil.copy(ck6, bad)
    with h5py.File(bad) as f:
        offset = f["model"]["layers.0.attention.wq.weight"].id.get_offset()
    with open(bad, "r+b") as f:
        f.seek(offset + 100)
        byte = f.read(1)
        f.seek(offset + 100)
        f.write(bytes([byte[0] ^ 0x40]))
    out = os.path.join(a.out, "flipped_hf")
    res = run([a.meshtrain, "ckpt", "export", "--format", "safetensors", "--output", out, bad])
    left = sorted(os.listdir(out)) if os.path.isdir(out) else []
    checks.append(("exporting a corrupt checkpoint is refused and writes nothing",
                   one_error(res, bad, "checksum") and not any(n in left for n in ("model.safetensors", "config.json"))))
    # A MoE run whose selection bias moved (load_balance_coeff > 0): Hugging Face's routers have
    # no bias, so the export is refused naming the dataset.
    biased = os.path.join(a.out, "qwen3_moe_biased")
    res = train(a, biased, ["--training.steps=3"] + [x for x in MODELS["qwen3_moe"] if "load_balance" not in x])
    context += res.stderr[-2000:]
    res = run([a.meshtrain, "ckpt", "export", "--format", "safetensors", "--output", os.path.join(a.out, "biased_hf"),
               os.path.join(biased, "checkpoints", "step-00000003.h5")])
    checks.append(("exporting a MoE model whose expert bias moved is refused",
                   one_error(res, "moe.expert_bias", "load_balance_coeff = 0")))
    res = run([a.meshtrain, "ckpt", "export", "--format", "gguf", "--output", out, ck6])
    checks.append(("an unknown export format is refused", one_error(res, "gguf", "not implemented yet")))
    report(checks, context)


if __name__ == "__main__":
    main()
