#!/usr/bin/env python3
"""Checks a `meshtrain ckpt export --format safetensors` folder with an independent PyTorch model
written in Hugging Face's conventions (no meshtrain code, no transformers needed): parses
model.safetensors (header, offsets, dtypes) and config.json, builds LlamaForCausalLM /
Qwen3ForCausalLM's forward pass in float64 from them — HF parameter names, rotate-half RoPE with
`rope_scaling` rope_type "llama3", Qwen3's per-head q/k RMSNorm before RoPE, repeat_kv grouped-query
attention, SwiGLU MLP, tied or separate lm_head — and computes the mean next-token cross-entropy on
the dump's /batch/tokens. It must equal the loss meshtrain computed on that batch with the same
weights (the dump's `loss` attribute, written by `dump_grads --checkpoint`) to --tol relative.

With --require-sensitive the script also undoes the q/k row permutation (feeding Meta's
interleaved layout to the rotate-half model) and requires that loss to miss meshtrain's by at least
100 times the error of the permuted one, so the batch can tell a wrong permutation apart (in a
small, briefly trained model attention is nearly uniform and the miss can be below --tol).

usage: /usr/bin/python3 validation/check_export.py EXPORT_DIR DUMP.h5 [--tol 1e-5] [--require-sensitive]
"""
import argparse
import json
import math
import os
import struct
import sys

import h5py
import numpy as np
import torch


def read_safetensors(path):
    """{name: float64 tensor} from a safetensors file; checks the header's layout."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    tensors, end = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, stop = info["data_offsets"]
        if info["dtype"] != "F32" or begin != end or stop - begin != 4 * math.prod(info["shape"]):
            sys.exit(f"{path}: bad header entry {name}: {info}")
        tensors[name] = torch.from_numpy(np.frombuffer(data[begin:stop], dtype="<f4").reshape(info["shape"]).astype(np.float64))
        end = stop
    if end != len(data):
        sys.exit(f"{path}: data section is {len(data)} bytes, the header covers {end}")
    return tensors


def inv_frequencies(cfg):
    """RoPE inverse frequencies as transformers computes them (default or rope_type llama3)."""
    dh = cfg["head_dim"]
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    rs = cfg.get("rope_scaling")
    if rs:
        if rs["rope_type"] != "llama3":
            sys.exit(f"rope_type {rs['rope_type']} not handled")
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def hf_loss(cfg, w, tokens):
    """Mean cross-entropy of tokens[:, 1:] given tokens[:, :-1]; tokens [B, T+1]."""
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    b, t = inp.shape
    hq, hkv, dh, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    qwen = cfg["model_type"] in ("qwen3", "qwen3_moe")
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_frequencies(cfg)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, T, Dh]
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    x = w["model.embed_tokens.weight"][inp]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(b, t, hq, dh)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(b, t, hkv, dh)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(b, t, hkv, dh).transpose(1, 2)
        if qwen:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, T, Dh]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
        attn = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + attn.transpose(1, 2).reshape(b, t, hq * dh) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate_proj.weight" in w:
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        else:
            x = x + sparse_moe(cfg, w, p, h)
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    logits = x @ head.T
    return torch.nn.functional.cross_entropy(logits.reshape(b * t, -1), tgt.reshape(-1)).item()


def sparse_moe(cfg, w, p, h):
    """The sparse MoE block as Hugging Face's Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock
    compute it: router logits, softmax in float, top-k, renormalized (Mixtral always; Qwen3-MoE
    when norm_topk_prob), each chosen expert's SwiGLU output weighted and summed."""
    b, t, d = h.shape
    mixtral = cfg["model_type"] == "mixtral"
    base = p + ("block_sparse_moe." if mixtral else "mlp.")
    k = cfg["num_experts_per_tok"]
    n_experts = cfg["num_local_experts"] if mixtral else cfg["num_experts"]
    hs = h.reshape(b * t, d)
    probs = torch.softmax(hs @ w[base + "gate.weight"].T, dim=-1)
    weights, chosen = torch.topk(probs, k, dim=-1)
    if mixtral or cfg.get("norm_topk_prob"):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(hs)
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for e in range(n_experts):
        tok, slot = (chosen == e).nonzero(as_tuple=True)
        if len(tok) == 0:
            continue
        g, u, dn = (w[f"{base}experts.{e}.{n}.weight"] for n in names)
        y = (torch.nn.functional.silu(hs[tok] @ g.T) * (hs[tok] @ u.T)) @ dn.T
        out = out.index_add(0, tok, weights[tok, slot, None] * y)
    return out.view(b, t, d)


def expected_tensors(cfg):
    """Tensors a Hugging Face folder of this config holds."""
    qwen = cfg["model_type"] in ("qwen3", "qwen3_moe")
    n = 2 + (0 if cfg["tie_word_embeddings"] else 1)
    for i in range(cfg["num_hidden_layers"]):
        n += 6 + (2 if qwen else 0)  # two norms, q/k/v/o, q/k norms
        if cfg["model_type"] == "mixtral":
            n += 1 + 3 * cfg["num_local_experts"]
        elif cfg["model_type"] == "qwen3_moe" and i not in cfg["mlp_only_layers"] and (
                i + 1) % cfg["decoder_sparse_step"] == 0:
            n += 1 + 3 * cfg["num_experts"]
        else:
            n += 3
    return n


def unpermute(w, cfg):
    """Undoes the export's q/k row permutation (rotate-half order back to interleaved)."""
    dh = cfg["head_dim"]
    out = dict(w)
    for name, t in w.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "q_norm.weight", "k_norm.weight")):
            rows = t.shape[0]
            r = t.reshape(rows // dh, 2, dh // 2, -1).transpose(1, 2).reshape(t.shape)
            out[name] = r
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("dump")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--require-sensitive", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(a.export_dir, "config.json")))
    w = read_safetensors(os.path.join(a.export_dir, "model.safetensors"))
    with h5py.File(a.dump, "r") as f:
        tokens = f["batch"]["tokens"][()]
        want = float(f.attrs["loss"])
        # the dump holds each expert-first MoE tensor once; the export one tensor per expert
        n_params = sum(f["params"][k].shape[0] if ".moe.experts." in k else 1 for k in f["params"])
    expected = expected_tensors(cfg)
    failed = False
    if len(w) != expected or len(w) != n_params:
        print(f"FAIL: {len(w)} tensors in the export, {n_params} in the dump, {expected} expected from config.json")
        failed = True
    got = hf_loss(cfg, w, tokens)
    err = abs(got - want) / abs(want)
    print(f"{cfg['architectures'][0]}: loss {got:.8f} (PyTorch, float64, HF layout) vs {want:.8f} (meshtrain), "
          f"relative error {err:.2e} (tol {a.tol:g})")
    failed |= not err <= a.tol
    if a.require_sensitive:
        wrong = hf_loss(cfg, unpermute(w, cfg), tokens)
        werr = abs(wrong - want) / abs(want)
        print(f"without the q/k permutation: loss {wrong:.8f}, relative error {werr:.2e} "
              f"({werr / max(err, 1e-300):.0f}x the permuted error; at least 100x required)")
        failed |= not werr >= 100 * err
    if failed:
        sys.exit(1)
    print("ok: the export reproduces meshtrain's loss")


if __name__ == "__main__":
    main()
