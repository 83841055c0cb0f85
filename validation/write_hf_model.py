#!/usr/bin/env python3
"""Writes a random Llama 3 (LlamaForCausalLM) or Qwen3 (Qwen3ForCausalLM) model as a Hugging Face
model folder with its own safetensors writer (no meshtrain code, no transformers, no safetensors
package): config.json, and model.safetensors — or, with --shards N, N files
model-0000i-of-0000N.safetensors and model.safetensors.index.json — in float32, bfloat16 or
float16 (torch's round-to-nearest-even). Then computes the reference loss with validation/
check_export.py's float64 forward pass in Hugging Face's conventions (rotate-half RoPE, q/k norm
before RoPE, repeat_kv, SwiGLU, tied or separate head) on the weights as stored.

With --store PATH it also writes a meshtrain token store whose train split is one random sample of
--seq-len tokens repeated, so every training sample (a window of seq_len + 1 tokens at stride
seq_len) is the same sequence: a training step's loss on any layout and batch is that sample's
loss, which the script prints as `loss`. `loss_unpermuted` is the loss with the q/k rows read in
Meta's interleaved order instead: how far a loader that forgot the rotary permutation would miss.

Weights are drawn so that the loss depends on every transform (sharp attention from large q/k
projections, norm weights away from 1, a head unlike the embedding).

usage: /usr/bin/python3 validation/write_hf_model.py --out DIR [--arch llama|qwen3] [--dtype bfloat16]
           [--shards 2] [--hidden 64] [--layers 2] [--heads 4] [--kv-heads 2] [--head-dim 16]
           [--intermediate 128] [--vocab 512] [--tie] [--seed 0] [--store H5 --seq-len 32]
prints one JSON line: {"loss": ..., "loss_unpermuted": ..., "tensors": ..., "files": [...]}
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import hf_loss, unpermute  # noqa: E402

DTYPES = {"float32": (torch.float32, "F32"), "bfloat16": (torch.bfloat16, "BF16"), "float16": (torch.float16, "F16")}


def make_config(a):
    cfg = {
        "architectures": ["Qwen3ForCausalLM" if a.arch == "qwen3" else "LlamaForCausalLM"],
        "model_type": "qwen3" if a.arch == "qwen3" else "llama",
        "hidden_size": a.hidden, "intermediate_size": a.intermediate, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
        "vocab_size": a.vocab, "rms_norm_eps": a.eps, "rope_theta": a.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": a.tie, "hidden_act": "silu", "attention_bias": False,
        "max_position_embeddings": 4096, "torch_dtype": a.dtype,
    }
    if a.arch == "llama":
        cfg["mlp_bias"] = False
    else:
        cfg["use_sliding_window"] = False
    return cfg


def make_weights(cfg, seed):
    """{hf name: float32 tensor}, drawn from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    d, hq, hkv, dh, ff, v = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                              "intermediate_size", "vocab_size"))

    def normal(*shape, std):
        return torch.randn(*shape, generator=g) * std

    def norm_weight(n):
        return 1.0 + normal(n, std=0.3)

    w = {"model.embed_tokens.weight": normal(v, d, std=1.0), "model.norm.weight": norm_weight(d)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(v, d, std=2.0 / math.sqrt(d))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(d)
        w[p + "post_attention_layernorm.weight"] = norm_weight(d)
        w[p + "self_attn.q_proj.weight"] = normal(hq * dh, d, std=3.0 / math.sqrt(d))
        w[p + "self_attn.k_proj.weight"] = normal(hkv * dh, d, std=3.0 / math.sqrt(d))
        w[p + "self_attn.v_proj.weight"] = normal(hkv * dh, d, std=1.0 / math.sqrt(d))
        w[p + "self_attn.o_proj.weight"] = normal(d, hq * dh, std=1.0 / math.sqrt(hq * dh))
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm_weight(dh)
            w[p + "self_attn.k_norm.weight"] = norm_weight(dh)
        w[p + "mlp.gate_proj.weight"] = normal(ff, d, std=1.0 / math.sqrt(d))
        w[p + "mlp.up_proj.weight"] = normal(ff, d, std=1.0 / math.sqrt(d))
        w[p + "mlp.down_proj.weight"] = normal(d, ff, std=1.0 / math.sqrt(ff))
    return w


def write_safetensors(path, tensors, st_dtype):
    """Writes {name: tensor already in the file's dtype} as one safetensors file (header keys
    sorted, data in that order, header padded with spaces to 8 bytes)."""
    header, offset, blobs = {"__metadata__": {"format": "pt", "producer": "validation/write_hf_model.py"}}, 0, []
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy().tobytes()
        header[name] = {"dtype": st_dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_store(path, sample, vocab):
    """A meshtrain token store (doc/data-format.md) whose train split repeats `sample` 64 times."""
    import h5py
    train = np.tile(np.asarray(sample, dtype=np.uint16), 64)
    val = np.tile(np.asarray(sample, dtype=np.uint16), 4)
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "meshtrain-token-store"
        f.attrs["format_version"] = np.int64(1)
        f.attrs["vocab_size"] = np.int64(vocab)
        f.attrs["eos_id"] = np.int64(vocab - 1)
        f.attrs["bos_id"] = np.int64(-1)
        f.attrs["source"] = "validation/write_hf_model.py"
        for split, toks in (("train", train), ("validation", val)):
            f.create_dataset(f"{split}/tokens", data=toks)
            f.create_dataset(f"{split}/doc_offsets", data=np.array([0, len(toks)], dtype=np.uint64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", choices=("llama", "qwen3"), default="llama")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--shards", type=int, default=1)
    for k, v in (("hidden", 64), ("layers", 2), ("heads", 4), ("kv-heads", 2), ("head-dim", 16),
                 ("intermediate", 128), ("vocab", 512), ("seed", 0), ("seq-len", 32)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--tie", action="store_true")
    ap.add_argument("--store")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    cfg = make_config(a)
    torch_dtype, st_dtype = DTYPES[a.dtype]
    stored = {k: t.to(torch_dtype) for k, t in make_weights(cfg, a.seed).items()}
    names = sorted(stored)
    files = []
    if a.shards == 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), stored, st_dtype)
        files.append("model.safetensors")
    else:
        weight_map = {}
        for s in range(a.shards):
            fname = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            part = {n: stored[n] for n in names[s::a.shards]}
            write_safetensors(os.path.join(a.out, fname), part, st_dtype)
            weight_map.update({n: fname for n in part})
            files.append(fname)
        total = sum(t.numel() * t.element_size() for t in stored.values())
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    # The reference computes from the stored values (what the files hold), widened to float64.
    w = {k: t.to(torch.float64) for k, t in stored.items()}
    g = torch.Generator().manual_seed(a.seed + 1)
    base = torch.randint(0, a.vocab, (a.seq_len,), generator=g)
    sample = torch.cat([base, base[:1]])[None, :]  # one window of the periodic stream
    out = {"loss": hf_loss(cfg, w, sample), "loss_unpermuted": hf_loss(cfg, unpermute(w, cfg), sample),
           "tensors": len(stored), "files": files}
    if a.store:
        write_store(a.store, base.tolist(), a.vocab)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
