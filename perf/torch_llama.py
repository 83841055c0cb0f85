#!/usr/bin/env python3
"""perf/torch_llama: the PyTorch side of perf/gpu_step_bench — full training steps of the
project's independent PyTorch Llama model (validation/llama_reference.py, LlamaReference) on one
device, eager or under torch.compile, with random weights and random tokens.

Precision "bf16" is as close as PyTorch gets to meshtrain's mixed precision
([training] mixed_precision_param = "bfloat16"): float32 master weights, gradients and AdamW
state; a bfloat16 copy of every weight and bfloat16 activations in forward and backward (RMSNorm
statistics in float32); float32 logits for the cross-entropy. "fp32" keeps everything float32
(the CPU smoke test). Attention is torch.nn.functional.scaled_dot_product_attention (causal,
grouped-query heads repeated as in TorchTitan's Llama 3) where PyTorch has it, else the
reference's einsum. One step: loss forward + backward, clip_grad_norm_(max_norm), AdamW step
(fused=True on CUDA), zero_grad(set_to_none=True); timed from a torch.cuda.synchronize() before it
to one after it (wall clock on CPU).

Prints one JSON line and writes it to --json: status ("ok" | "oom" | "unavailable" | "error" with
`error`), step times, median step time over the steps after --warmup, tokens/s, peak memory
(torch.cuda.max_memory_allocated / _reserved over the timed steps, bytes), the first step's time
(compilation for --mode compile), losses, versions and the device name. Exits 0 for every status
so that the caller reports it; 2 for bad arguments.

usage: python3 perf/torch_llama.py --model-json MODEL.json --batch B --seq-len T
       [--device cuda] [--mode eager|compile] [--precision bf16|fp32] [--steps 20] [--warmup 5]
       [--data-vocab V] [--max-norm 1.0] [--json OUT]
MODEL.json: `meshtrain model info --deck DECK --json` (shape, RoPE, tying; the reference's keys).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "validation"))
from llama_reference import LlamaReference, is_moe_layer  # noqa: E402


def init_params(a, device, seed):
    """Meta-named float32 parameters of the shape in `a` (model info JSON): weights [out, in]
    ~ N(0, 0.02²), norm weights 1. Made on `device` directly (no host copy of a 1B model)."""
    d, v, dh, f = a["dim"], a["vocab_size"], a["head_dim"], a["ffn_dim"]
    hq, hkv = a["n_heads"], a["n_kv_heads"]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shapes = {"tok_embeddings.weight": (v, d), "norm.weight": (d,)}
    if not a.get("tie_word_embeddings"):
        shapes["output.weight"] = (v, d)
    for i in range(a["n_layers"]):
        pre = f"layers.{i}."
        shapes.update({pre + "attention.wq.weight": (hq * dh, d), pre + "attention.wk.weight": (hkv * dh, d),
                       pre + "attention.wv.weight": (hkv * dh, d), pre + "attention.wo.weight": (d, hq * dh),
                       pre + "feed_forward.w1.weight": (f, d), pre + "feed_forward.w3.weight": (f, d),
                       pre + "feed_forward.w2.weight": (d, f), pre + "attention_norm.weight": (d,),
                       pre + "ffn_norm.weight": (d,)})
        if is_moe_layer(a, i):  # router, expert-first routed experts, shared experts
            e, he, ns = a["num_experts"], a["moe_inter_dim"], a.get("num_shared_experts", 0)
            for k in ("feed_forward.w1.weight", "feed_forward.w3.weight", "feed_forward.w2.weight"):
                del shapes[pre + k]
            shapes.update({pre + "moe.router.gate.weight": (e, d), pre + "moe.experts.w1": (e, he, d),
                           pre + "moe.experts.w3": (e, he, d), pre + "moe.experts.w2": (e, d, he)})
            if ns:
                shapes.update({pre + "moe.shared_experts.w1.weight": (ns * he, d),
                               pre + "moe.shared_experts.w3.weight": (ns * he, d),
                               pre + "moe.shared_experts.w2.weight": (d, ns * he)})
        if a.get("qk_norm"):
            shapes.update({pre + "attention.q_norm.weight": (dh,), pre + "attention.k_norm.weight": (dh,)})
    params = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            params[name] = torch.ones(shape, device=device)
        else:
            params[name] = torch.randn(shape, generator=gen, device=device).mul_(0.02)
    return params


def is_oom(e):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(e, oom_type)) or "out of memory" in str(e).lower()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-json", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--data-vocab", type=int, default=0, help="token ids drawn from [0, V) (default: the model's vocabulary)")
    p.add_argument("--max-norm", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args()
    if a.steps <= a.warmup:
        sys.exit(f"torch_llama.py: --steps ({a.steps}) must exceed --warmup ({a.warmup})")
    with open(a.model_json) as f:
        margs = json.load(f)
    cuda = a.device.startswith("cuda")
    res = {"mode": a.mode, "precision": a.precision, "device": a.device, "batch": a.batch, "seq_len": a.seq_len,
           "steps": a.steps, "warmup": a.warmup, "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda, "python": platform.python_version(),
           "attention": "sdpa" if hasattr(F, "scaled_dot_product_attention") else "einsum"}

    def finish(status, **extra):
        res.update(status=status, **extra)
        print(json.dumps(res))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        sys.exit(0)

    if cuda:
        if not torch.cuda.is_available():
            finish("error", error="torch.cuda.is_available() is False (no GPU, or a CPU-only PyTorch build)")
        torch.cuda.set_device(torch.device(a.device if ":" in a.device else a.device + ":0"))
        res["device_name"] = torch.cuda.get_device_name()
    else:
        res["device_name"] = platform.processor() or platform.machine()
        res["threads"] = torch.get_num_threads()
    if a.mode == "compile" and not hasattr(torch, "compile"):
        finish("unavailable", error=f"torch.compile needs PyTorch >= 2.0 (this is {torch.__version__})")

    try:
        params = init_params(margs, a.device, a.seed)
        model = LlamaReference(margs, params, dtype=torch.float32, device=a.device,
                               compute_dtype=torch.bfloat16 if a.precision == "bf16" else None)
        del params
        leaves = list(model.params.values())
        res["parameters"] = sum(t.numel() for t in leaves)
        opt_kw = {"lr": a.lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
        try:
            opt = torch.optim.AdamW(leaves, fused=True, **opt_kw) if cuda else torch.optim.AdamW(leaves, foreach=True, **opt_kw)
            res["adamw"] = "fused" if cuda else "foreach"
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW(leaves, **opt_kw)
            res["adamw"] = "default"

        def loss_of(tokens):
            return model.loss(tokens, attention=res["attention"])

        loss_fn = torch.compile(loss_of) if a.mode == "compile" else loss_of
        vocab = a.data_vocab or margs["vocab_size"]
        gen = torch.Generator(device=a.device)
        gen.manual_seed(a.seed + 1)
        data = torch.randint(0, vocab, (a.steps, a.batch, a.seq_len + 1), generator=gen, device=a.device)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        times, losses = [], []
        for step in range(a.steps):
            if cuda and step == a.warmup:
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            loss = loss_fn(data[step])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(leaves, a.max_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    except Exception as e:  # noqa: BLE001 — every failure is reported to the caller as a status
        if is_oom(e):
            finish("oom", error=str(e).splitlines()[0][:500])
        finish("error", error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-4000:])
    timed = times[a.warmup:]
    med = statistics.median(timed)
    extra = {}
    if cuda:
        extra = {"memory_peak_bytes": torch.cuda.max_memory_allocated(),
                 "memory_reserved_peak_bytes": torch.cuda.max_memory_reserved()}
    finish("ok", step_times_s=times, median_step_s=med, first_step_s=times[0],
           tokens_per_s=a.batch * a.seq_len / med, loss_first=losses[0], loss_last=losses[-1], **extra)


if __name__ == "__main__":
    main()
