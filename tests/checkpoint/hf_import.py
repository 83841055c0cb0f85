#!/usr/bin/env python3
"""[checkpoint] initial_load_path / initial_load_in_hf / initial_load_model_only.

1. Hugging Face folders written by the independent PyTorch reference (validation/write_hf_model.py,
   its own safetensors writer): Llama 3 in bfloat16 over two files with model.safetensors.index.json,
   Qwen3 (q/k norm, tied embeddings) in float16. Loaded on 1 rank and on TP 2 x FSDP 2 (Llama
   also on DDP 2 x CP 2: replicated parameters, context parallelism), the first
   training step's loss equals the reference's float64 loss to 1e-5 relative, and the reference
   shows that a loader which skipped the rotary permutation would miss by more than 10x that.
2. Export -> import round trip: a model trained on one layout saves its last step as a Hugging Face
   folder (last_save_in_hf, float32); a run on another layout starts from that folder, takes one
   step at lr 1e-30 (no weight moves) and dumps its final model, whose parameters equal the
   model-only HDF5 checkpoint of that step bit for bit -- Llama (GQA) into TP 2 x FSDP 2, Qwen3
   (q/k norm, tied) into pp 2, Qwen3-MoE into ep 2, Mixtral into FSDP 3.
3. initial_load_model_only = false resumes the whole training state from another run's
   checkpoint: its next step's loss equals that run's; once the run has a checkpoint of its own, a
   restart resumes it and ignores initial_load_path.
4. Refusals, one line and exit 2: a config.json that disagrees with the deck (field, both values),
   a Hugging Face folder without initial_load_in_hf, initial_load_in_hf with
   initial_load_model_only = false, a truncated safetensors file.

usage: hf_import.py --meshtrain BIN --deck DECK --data H5 --out DIR
"""
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_common import losses, parse_run_args, report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRITER = os.path.join(ROOT, "validation", "write_hf_model.py")
P = "--parallelism."
TP2_FSDP2 = (4, [P + "tensor_parallel_degree=2"])
DDP2_CP2 = (4, [P + "data_parallel_replicate_degree=2", P + "data_parallel_shard_degree=1",
                P + "context_parallel_degree=2"])

QWEN3 = ["--model.name=qwen3", "--model.qk_norm=true", "--model.tie_word_embeddings=true", "--model.head_dim=16",
         "--model.ffn_hidden_dim=128"]
MODELS = {  # deck overrides on the tiny deck (dim 64, 2 layers, 4 heads, 2 KV heads, vocab 512)
    "llama": ["--model.ffn_hidden_dim=128"],
    "qwen3": QWEN3,
    "qwen3_moe": ["--model.name=qwen3", "--model.head_dim=16", "--model.ffn_hidden_dim=128", "--model.n_layers=4",
                  "--model.num_experts=4", "--model.top_k=2", "--model.moe_inter_dim=48", "--model.route_norm=true",
                  "--model.moe_layer_step=2", "--model.load_balance_coeff=0"],
    "mixtral": ["--model.name=mixtral", "--model.num_experts=4", "--model.moe_inter_dim=48",
                "--model.load_balance_coeff=0"],
}


def train(a, folder, ranks, extra, data=None):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), a.meshtrain, "train", "--deck", a.deck,
           f"--training.dataset={data or a.data}", f"--job.dump_folder={folder}", "--validation.enable=false"] + extra
    return subprocess.run(cmd, capture_output=True, text=True)


def same_model(a, b):
    """Whether every /model dataset of checkpoint `a` is in `b` with the same bits."""
    import h5py
    import numpy as np
    with h5py.File(a) as f, h5py.File(b) as g:
        return all(k in g["model"] and np.array_equal(f["model"][k][()], g["model"][k][()]) for k in f["model"])


def one_error(res, *needles):
    """Exit 2 and one line of stderr holding every needle (rank 0's message, printed once)."""
    hits = [l for l in res.stderr.splitlines() if all(n in l for n in needles)]
    return res.returncode == 2 and len(hits) == 1


def main():
    a = parse_run_args()
    os.makedirs(a.out)
    checks, log = [], []

    def ok(name, cond, res=None):
        checks.append((name, bool(cond)))
        if res is not None and not cond:
            log.append(f"--- {name}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")

    # 1. Folders from the independent reference writer.
    refs = {"llama": (["--dtype", "bfloat16", "--shards", "2"], MODELS["llama"]),
            "qwen3": (["--arch", "qwen3", "--tie", "--dtype", "float16", "--eps", "1e-6", "--rope-theta", "1000000"],
                      QWEN3 + ["--model.norm_eps=1e-6", "--model.rope_theta=1000000"])}
    for name, (writer_args, deck) in refs.items():
        hf, store = os.path.join(a.out, f"ref_{name}"), os.path.join(a.out, f"ref_{name}.h5")
        w = subprocess.run([sys.executable, WRITER, "--out", hf, "--store", store, *writer_args],
                           capture_output=True, text=True, check=True)
        ref = json.loads(w.stdout.strip().splitlines()[-1])
        miss = abs(ref["loss_unpermuted"] - ref["loss"]) / ref["loss"]
        ok(f"{name}: a loader without the q/k permutation would miss the reference loss by {miss:.1e} (> 1e-4)",
           miss > 1e-4)
        layouts = [(1, []), TP2_FSDP2] + ([DDP2_CP2] if name == "llama" else [])
        for ranks, layout in layouts:
            folder = os.path.join(a.out, f"ref_{name}_{ranks}")
            res = train(a, folder, ranks, ["--training.steps=1", "--checkpoint.initial_load_in_hf=true",
                                           f"--checkpoint.initial_load_path={hf}"] + deck + layout, data=store)
            got = losses(folder).get(1) if res.returncode == 0 else None
            err = abs(got - ref["loss"]) / ref["loss"] if got is not None else float("inf")
            dtype = writer_args[writer_args.index("--dtype") + 1]
            ok(f"{name} ({dtype} file) on {ranks} rank(s): loss {got} vs the "
               f"reference's {ref['loss']:.8f}, relative error {err:.1e} (<= 1e-5)", err <= 1e-5, res)

    # 2. Export -> import round trips, bitwise against the HDF5 model-only checkpoint.
    trips = {"llama": (2, [], TP2_FSDP2),
             "qwen3": (1, [], (2, [P + "pipeline_parallel_degree=2", "--training.local_batch_size=8"])),
             "qwen3_moe": (1, [], (2, [P + "expert_parallel_degree=2"])),
             "mixtral": (2, [P + "tensor_parallel_degree=2"], (3, ["--training.global_batch_size=6",
                                                                  "--training.local_batch_size=2"]))}
    for name, (save_ranks, save_layout, (load_ranks, load_layout)) in trips.items():
        src = os.path.join(a.out, f"trip_{name}_src")
        last = 3 if name == "llama" else 1  # llama's full step-2 checkpoint serves part 3
        res = train(a, src, save_ranks, [f"--training.steps={last}", "--checkpoint.enable=true",
                                         "--checkpoint.interval=2", "--checkpoint.last_save_model_only=true",
                                         "--checkpoint.last_save_in_hf=true"] + MODELS[name] + save_layout)
        if res.returncode != 0:
            ok(f"{name}: the source run trains and saves", False, res)
            continue
        ck = os.path.join(src, "checkpoints", f"step-{last:08d}")
        # One step at lr 1e-30 moves no weight (every update is below half an ulp of the weights,
        # which are all far from 0 after training), so the run's final model is what it loaded.
        run = os.path.join(a.out, f"trip_{name}_hf")
        res = train(a, run, load_ranks, ["--training.steps=1", "--optimizer.lr=1e-30", "--job.final_dump=true",
                                         "--checkpoint.initial_load_in_hf=true", f"--checkpoint.initial_load_path={ck}-hf"]
                    + MODELS[name] + load_layout)
        loaded = res.returncode == 0 and "initial weights from" in res.stdout + res.stderr
        ok(f"{name}: starts from the Hugging Face export on {load_ranks} ranks {' '.join(load_layout)}", loaded, res)
        if loaded:
            ok(f"{name}: the imported parameters equal the exported checkpoint's bit for bit",
               same_model(f"{ck}.h5", os.path.join(run, "model_final.h5")))

    # 3. Whole-state initial load, then the run's own checkpoint wins.
    src = os.path.join(a.out, "trip_llama_src")
    full = os.path.join(a.out, "full_state")
    res = train(a, full, 2, ["--training.steps=3", "--checkpoint.enable=true", "--checkpoint.interval=1",
                             "--checkpoint.initial_load_model_only=false",
                             f"--checkpoint.initial_load_path={src}/checkpoints/step-00000002.h5"] + MODELS["llama"])
    mine, theirs = losses(full) if res.returncode == 0 else {}, losses(src)
    ok("initial_load_model_only = false resumes at step 2 and reproduces the source run's step 3 loss bit for bit",
       res.returncode == 0 and list(mine) == [3] and mine.get(3) == theirs.get(3), res)
    res = train(a, full, 2, ["--training.steps=4", "--checkpoint.enable=true", "--checkpoint.interval=1",
                             "--checkpoint.initial_load_in_hf=true",
                             f"--checkpoint.initial_load_path={os.path.join(a.out, 'ref_llama')}"] + MODELS["llama"])
    out = res.stdout + res.stderr
    ok("a restart resumes its own checkpoint (step 3) and ignores initial_load_path",
       res.returncode == 0 and "resumed from" in out and "initial weights" not in out, res)

    # 4. Refusals.
    hf = os.path.join(a.out, "ref_llama")
    res = train(a, os.path.join(a.out, "bad1"), 1, ["--training.steps=1", "--checkpoint.initial_load_in_hf=true",
                                                    f"--checkpoint.initial_load_path={hf}", "--model.n_layers=3"]
                + MODELS["llama"])
    ok("a config.json of another depth is refused naming the field and both values",
       one_error(res, "config.json", "num_hidden_layers is 2", "the deck's model has 3"), res)
    res = train(a, os.path.join(a.out, "bad2"), 1, ["--training.steps=1", f"--checkpoint.initial_load_path={hf}"] +
                MODELS["llama"])
    ok("a Hugging Face folder without initial_load_in_hf is refused with the key to set",
       one_error(res, hf, "initial_load_in_hf = true"), res)
    res = train(a, os.path.join(a.out, "bad3"), 1, ["--training.steps=1", "--checkpoint.initial_load_in_hf=true",
                                                    "--checkpoint.initial_load_model_only=false",
                                                    f"--checkpoint.initial_load_path={hf}"] + MODELS["llama"])
    ok("initial_load_in_hf with initial_load_model_only = false is refused naming the key",
       one_error(res, "[checkpoint] initial_load_model_only"), res)
    cut = os.path.join(a.out, "truncated")
    shutil.copytree(hf, cut)
    first = os.path.join(cut, "model-00001-of-00002.safetensors")
    os.truncate(first, os.path.getsize(first) - 100)
    res = train(a, os.path.join(a.out, "bad4"), 1, ["--training.steps=1", "--checkpoint.initial_load_in_hf=true",
                                                    f"--checkpoint.initial_load_path={cut}"] + MODELS["llama"])
    ok("a truncated safetensors file is refused naming it", one_error(res, first, "outside the data section"), res)
    report(checks, "\n".join(log))


if __name__ == "__main__":
    main()
