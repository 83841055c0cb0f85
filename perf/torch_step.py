#!/usr/bin/env python3
"""PyTorch baseline for perf/cpu_step_bench: the same Llama-style model in float32, trained on
random tokens with AdamW and gradient clipping; prints the median full-step time (forward,
backward, clip, optimizer step, zero_grad) and tokens/s. Uses PyTorch's fast paths where they
exist (scaled_dot_product_attention when available, fused/foreach AdamW).

usage: /usr/bin/python3 perf/torch_step.py --dim 256 --n-layers 6 --n-heads 16 --n-kv-heads 16
       --vocab 2048 --ffn-dim 768 --seq-len 256 --batch 8 --threads 2 [--steps 12 --warmup 2 --json OUT]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, hq, hkv, ffn):
        super().__init__()
        self.hq, self.hkv, self.dh = hq, hkv, d // hq
        self.attention_norm = torch.nn.Parameter(torch.ones(d))
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.wq = torch.nn.Linear(d, hq * self.dh, bias=False)
        self.wk = torch.nn.Linear(d, hkv * self.dh, bias=False)
        self.wv = torch.nn.Linear(d, hkv * self.dh, bias=False)
        self.wo = torch.nn.Linear(hq * self.dh, d, bias=False)
        self.w1 = torch.nn.Linear(d, ffn, bias=False)
        self.w3 = torch.nn.Linear(d, ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, d, bias=False)

    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.norm(x, self.attention_norm)
        q = self.wq(h).view(b, t, self.hq, self.dh)
        k = self.wk(h).view(b, t, self.hkv, self.dh)
        v = self.wv(h).view(b, t, self.hkv, self.dh)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if self.hkv != self.hq:
            k = k.repeat_interleave(self.hq // self.hkv, dim=1)
            v = v.repeat_interleave(self.hq // self.hkv, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / self.dh ** 0.5
            s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
            o = torch.softmax(s, -1) @ v
        x = x + self.wo(o.transpose(1, 2).reshape(b, t, -1))
        h = self.norm(x, self.ffn_norm)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rope(x, cos, sin):
    x2 = x.float().reshape(*x.shape[:-1], -1, 2)
    a, b = x2[..., 0], x2[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)


class Model(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = torch.nn.Embedding(a.vocab, a.dim)
        self.blocks = torch.nn.ModuleList(Block(a.dim, a.n_heads, a.n_kv_heads, a.ffn_dim) for _ in range(a.n_layers))
        self.norm = torch.nn.Parameter(torch.ones(a.dim))
        self.out = torch.nn.Linear(a.dim, a.vocab, bias=False)
        dh = a.dim // a.n_heads
        freqs = 500000.0 ** (-torch.arange(0, dh, 2).float() / dh)
        ang = torch.arange(a.seq_len).float()[:, None] * freqs[None, :]
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    def forward(self, tokens, targets):
        x = self.tok(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        x = Block.norm(x, self.norm)
        return F.cross_entropy(self.out(x).flatten(0, 1), targets.flatten())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, d in [("dim", 256), ("n-layers", 6), ("n-heads", 16), ("n-kv-heads", 16), ("vocab", 2048), ("ffn-dim", 768),
                 ("seq-len", 256), ("batch", 8), ("threads", 2), ("steps", 12), ("warmup", 2)]:
        p.add_argument(f"--{k}", type=int, default=d)
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Model(a)
    kwargs = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.1}
    try:
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **kwargs)
    except TypeError:
        opt = torch.optim.AdamW(model.parameters(), **kwargs)
    data = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1))
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
    med = statistics.median(times)
    res = {"median_step_s": med, "tokens_per_s": a.batch * a.seq_len / med, "threads": a.threads,
           "torch_version": torch.__version__, "steps": len(times)}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
