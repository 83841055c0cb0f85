"""An independent PyTorch implementation of meshtrain's Llama-3 / Qwen3 / Mixtral decoder, written from
the equations (Meta's reference model.py conventions), for checking meshtrain's loss and gradients.
Mixture-of-Experts blocks (moe_ffn) are written from their papers' equations too, with a per-expert
loop where meshtrain sorts tokens for grouped GEMMs.

Conventions shared with meshtrain (doc/checkpoint-format.md):
- Linear weights are [out, in] and y = x @ W.T; names follow Meta (tok_embeddings.weight, ...).
- RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w.
- RoPE is Meta's interleaved form: within a head, pairs (2j, 2j+1) rotate by pos * freq_j,
  freq_j = theta^(-2j/Dh), with Llama 3.1 scaling when enabled.
- Attention is causal with scale 1/sqrt(Dh); query head h reads kv head h // (Hq / Hkv). With
  `eos_id` (attn_mask_type = "block_causal") an explicit mask also keeps each query inside its
  document: document ids are the count of EOS tokens before a position (TorchTitan's
  get_document_mask_mod), so a document ends with, and includes, its EOS; RoPE keeps the sample
  positions.
- Loss is the mean cross-entropy over all B*T targets.

The same model serves perf/torch_llama.py (the PyTorch side of perf/gpu_step_bench.py): there it
runs on a GPU with float32 master weights and a bfloat16 `compute_dtype` (meshtrain's mixed
precision), and `attention="sdpa"` (torch.nn.functional.scaled_dot_product_attention, causal).
"""
import math

import torch

try:
    import numpy as np
except ImportError:  # perf/torch_llama.py passes tensors only; a GPU node's Python may lack numpy
    np = None


def rope_frequencies(args):
    dh = args["head_dim"]
    freqs = [args["rope_theta"] ** (-2.0 * j / dh) for j in range(dh // 2)]
    if args.get("use_rope_scaling"):
        factor, low, high = args["rope_scaling_factor"], args["rope_low_freq_factor"], args["rope_high_freq_factor"]
        orig = args["rope_original_max_seq_len"]
        low_wavelen, high_wavelen = orig / low, orig / high
        scaled = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                scaled.append(f)
            elif wavelen > low_wavelen:
                scaled.append(f / factor)
            else:
                smooth = (orig / wavelen - low) / (high - low)
                scaled.append((1 - smooth) * f / factor + smooth * f)
        freqs = scaled
    return freqs


def rms_norm(x, w, eps):
    if x.dtype in (torch.bfloat16, torch.float16):  # statistics in float32, result in x's dtype
        return rms_norm(x.float(), w.float(), eps).to(x.dtype)
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def apply_rope(x, cos, sin):
    """x: [B, T, H, Dh]; cos, sin: [T, Dh/2]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return out


def swiglu(x, w1, w2, w3):
    return (torch.nn.functional.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def is_moe_layer(args, i):
    """Block i has a Mixture-of-Experts feed-forward (num_experts > 0, past n_dense_layers, and
    i % moe_layer_step == moe_layer_step - 1)."""
    step = args.get("moe_layer_step", 1)
    return args.get("num_experts", 0) > 0 and i >= args.get("n_dense_layers", 0) and i % step == step - 1


def moe_ffn(x, p, pre, a, bias, force_balance):
    """Mixture-of-Experts feed-forward of block `pre` on x [B, T, D], written from the equations:
    token-choice top-k of the router scores (+ bias, for the choice only; or round-robin by
    position when force_balance), gates from the unbiased scores (renormalized when route_norm,
    times route_scale), each expert a SwiGLU FFN, plus the shared experts. Returns (out [B, T, D],
    extra loss): the sequence-wise balance loss (DeepSeek-V3 eq. 17-20, averaged over the
    sequences) and the router z-loss (ST-MoE eq. 5, mean over tokens), times their coefficients."""
    b, t, d = x.shape
    e, k = a["num_experts"], a["top_k"]
    xf = x.reshape(b * t, d)
    logits = xf @ p[pre + "moe.router.gate.weight"].T
    scores = torch.softmax(logits, dim=-1) if a["score_func"] == "softmax" else torch.sigmoid(logits)
    if force_balance:
        pos = torch.arange(t, device=x.device).repeat(b)
        idx = (pos[:, None] * k + torch.arange(k, device=x.device)[None, :]) % e
    else:
        idx = torch.topk(scores.detach() + bias, k, dim=-1).indices
    g = scores.gather(1, idx)
    if a["route_norm"]:
        g = g / (g.sum(dim=-1, keepdim=True) + 1e-20)
    g = g * a["route_scale"]
    out = torch.zeros_like(xf)
    w1, w2, w3 = (p[pre + f"moe.experts.{w}"] for w in ("w1", "w2", "w3"))
    for ex in range(e):
        tok, slot = (idx == ex).nonzero(as_tuple=True)
        if len(tok):
            out = out.index_add(0, tok, g[tok, slot, None] * swiglu(xf[tok], w1[ex], w2[ex], w3[ex]))
    if a.get("num_shared_experts", 0) > 0:
        s = pre + "moe.shared_experts."
        out = out + swiglu(xf, p[s + "w1.weight"], p[s + "w2.weight"], p[s + "w3.weight"])
    extra = torch.zeros((), dtype=x.dtype, device=x.device)
    if a.get("aux_loss_coeff", 0) > 0:
        sp = scores if a["score_func"] == "softmax" else scores / scores.sum(dim=-1, keepdim=True)
        chosen = torch.zeros(b * t, e, dtype=x.dtype, device=x.device).scatter(1, idx, 1.0)
        f = e / (k * t) * chosen.view(b, t, e).sum(dim=1)
        prob = sp.view(b, t, e).mean(dim=1)
        extra = extra + a["aux_loss_coeff"] * (f * prob).sum(dim=-1).mean()
    if a.get("z_loss_coeff", 0) > 0:
        extra = extra + a["z_loss_coeff"] * (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return out.view(b, t, d), extra


class LlamaReference:
    """Holds parameters as leaf tensors (requires_grad) and computes the loss of a batch.

    params: name -> array or tensor (Meta names, [out, in] weights); kept as `dtype` on `device`.
    compute_dtype: when set (torch.bfloat16), forward and backward use a copy of every parameter
    in that dtype, activations stay in it, and the logits return to `dtype` for the loss; the
    gradients reach the `dtype` leaves through the casts (master weights, as in meshtrain).
    """

    def __init__(self, args, params, dtype=torch.float64, device="cpu", compute_dtype=None, buffers=None,
                 force_balance=False):
        self.args = args
        # MoE selection biases (name -> [E]) and round-robin routing (moe_force_load_balance).
        self.buffers = {k: torch.tensor(np.asarray(v), dtype=dtype, device=device) for k, v in (buffers or {}).items()}
        self.force_balance = force_balance
        self.params = {k: (v.detach().to(device=device, dtype=dtype) if isinstance(v, torch.Tensor)
                           else torch.tensor(np.asarray(v), dtype=dtype, device=device)).requires_grad_()
                       for k, v in params.items()}
        self.dtype = dtype
        self.compute_dtype = compute_dtype

    def loss(self, tokens, attention="einsum", eos_id=None):
        """Mean cross-entropy of tokens [B, T+1] (array or tensor). attention: "einsum" (scores
        materialized, the checks' float64 path) or "sdpa" (scaled_dot_product_attention).
        eos_id: document masking from the inputs' EOS tokens (einsum only)."""
        a = self.args
        p = self.params
        if self.compute_dtype is not None:
            p = {k: v.to(self.compute_dtype) for k, v in p.items()}
        dev = self.params["tok_embeddings.weight"].device
        tokens = (tokens.to(device=dev, dtype=torch.long) if isinstance(tokens, torch.Tensor)
                  else torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=dev))
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        b, t = inp.shape
        hq, hkv, dh = a["n_heads"], a["n_kv_heads"], a["head_dim"]
        pos = torch.arange(t, dtype=self.dtype, device=dev)[:, None]
        ang = pos * torch.tensor(rope_frequencies(a), dtype=self.dtype, device=dev)[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        if attention == "einsum":
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=dev), diagonal=1)[None, None]  # [1, 1, T, T]
            if eos_id is not None:
                # doc[b, i] = number of EOS among inputs [0, i): masked where documents differ.
                ends = (inp == eos_id).long()
                doc = torch.cumsum(ends, dim=1) - ends
                mask = mask | (doc[:, None, :, None] != doc[:, None, None, :])  # [B, 1, T, T]
        elif eos_id is not None:
            raise ValueError("document masking (eos_id) needs attention='einsum'")
        h = p["tok_embeddings.weight"][inp]
        extra = torch.zeros((), dtype=self.dtype, device=dev)
        for i in range(a["n_layers"]):
            pre = f"layers.{i}."
            x = rms_norm(h, p[pre + "attention_norm.weight"], a["norm_eps"])
            q = (x @ p[pre + "attention.wq.weight"].T).view(b, t, hq, dh)
            k = (x @ p[pre + "attention.wk.weight"].T).view(b, t, hkv, dh)
            v = (x @ p[pre + "attention.wv.weight"].T).view(b, t, hkv, dh)
            if a.get("qk_norm"):
                q = rms_norm(q, p[pre + "attention.q_norm.weight"], a["norm_eps"])
                k = rms_norm(k, p[pre + "attention.k_norm.weight"], a["norm_eps"])
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            rep = hq // hkv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            if attention == "sdpa":  # [B, H, T, Dh]; causal, scale 1/sqrt(Dh)
                o = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
                o = o.transpose(1, 2).reshape(b, t, hq * dh)
            else:
                scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dh)
                scores = scores.masked_fill(mask, float("-inf"))
                o = torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, dim=-1), v).reshape(b, t, hq * dh)
            h = h + o @ p[pre + "attention.wo.weight"].T
            x = rms_norm(h, p[pre + "ffn_norm.weight"], a["norm_eps"])
            if is_moe_layer(a, i):
                bias = self.buffers.get(pre + "moe.expert_bias", torch.zeros(a["num_experts"], dtype=self.dtype, device=dev))
                y, layer_extra = moe_ffn(x, p, pre, a, bias, self.force_balance)
                h = h + y
                extra = extra + layer_extra
                continue
            g = x @ p[pre + "feed_forward.w1.weight"].T
            u = x @ p[pre + "feed_forward.w3.weight"].T
            h = h + (torch.nn.functional.silu(g) * u) @ p[pre + "feed_forward.w2.weight"].T
        x = rms_norm(h, p["norm.weight"], a["norm_eps"])
        out_w = p["tok_embeddings.weight"] if a.get("tie_word_embeddings") else p["output.weight"]
        logits = (x @ out_w.T).to(self.dtype)
        return torch.nn.functional.cross_entropy(logits.reshape(b * t, -1), tgt.reshape(-1)) + extra


ARG_NAMES = ["dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_dim", "norm_eps", "rope_theta",
             "use_rope_scaling", "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
             "rope_original_max_seq_len", "qk_norm", "tie_word_embeddings"]


MOE_ARG_NAMES = ["num_experts", "top_k", "num_shared_experts", "moe_inter_dim", "n_dense_layers", "moe_layer_step",
                 "route_norm", "route_scale", "load_balance_coeff", "aux_loss_coeff", "z_loss_coeff", "score_func"]


def load_dump(path, with_buffers=False):
    """Returns (args, params, grads, tokens, loss) from a meshtrain model dump (grads/tokens/loss may be None);
    with_buffers: also the MoE selection biases {name: [E]} and the moe_force_load_balance flag."""
    import h5py  # here, not at the top: perf/torch_llama.py imports this module where h5py may be missing

    with h5py.File(path, "r") as f:
        args = {}
        for k in ARG_NAMES + [n for n in MOE_ARG_NAMES if n in f.attrs]:
            v = f.attrs[k]
            if isinstance(v, (bytes, str)):
                args[k] = v.decode() if isinstance(v, bytes) else v
            else:
                args[k] = float(v) if isinstance(v, (float, np.floating)) else int(v)
        buffers = {k: f["buffers"][k][()] for k in f["buffers"]} if "buffers" in f else {}
        force_balance = bool(f.attrs["moe_force_load_balance"]) if "moe_force_load_balance" in f.attrs else False
        params = {k: f["params"][k][()] for k in f["params"]}
        grads = {k: f["grads"][k][()] for k in f["grads"]} if "grads" in f else None
        tokens = f["batch"]["tokens"][()] if "batch" in f else None
        loss = float(f.attrs["loss"]) if "loss" in f.attrs else None
    if with_buffers:
        return args, params, grads, tokens, loss, buffers, force_balance
    return args, params, grads, tokens, loss
