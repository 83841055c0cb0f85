#!/usr/bin/env python3
"""Draws loss, validation loss and tokens/s from a meshtrain metrics.jsonl into a PNG.

For a Mixture-of-Experts run whose metrics hold tokens-per-expert histograms ([metrics]
moe_histogram_freq) it also draws the expert-load heat map into <PNG stem>_expert_load.png: one
row per (MoE layer, expert), one column per histogram step, colour = the expert's tokens over the
layer's mean (1 = balanced), layers separated by lines.

usage: /usr/bin/python3 perf/plot_metrics.py METRICS.jsonl [--out PNG]
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics")
    p.add_argument("--out")
    a = p.parse_args()
    train, val, summary, loads = [], [], None, []
    with open(a.metrics) as f:
        for line in f:
            r = json.loads(line)
            if "moe_tokens_per_expert" in r:
                loads.append(r)
            if r.get("event") == "summary":
                summary = r
            elif "val_loss" in r:
                val.append(r)
            elif "loss" in r:
                train.append(r)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    ax1.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    if val:
        ax1.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="validation loss")
    if summary and summary.get("unigram_entropy"):
        ax1.axhline(summary["unigram_entropy"], color="gray", ls="--", label="unigram entropy (validation)")
    ax1.set_ylabel("loss (nats/token)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot([r["step"] for r in train], [r["tokens_per_s"] for r in train], color="tab:green")
    ax2.set_ylabel("tokens/s (global)")
    ax2.set_xlabel("step")
    ax2.grid(alpha=0.3)
    fig.suptitle(os.path.basename(os.path.dirname(os.path.abspath(a.metrics))) or "meshtrain run")
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(a.metrics)), "metrics.png")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(out)
    if loads:
        print(expert_load_heat_map(loads, os.path.splitext(out)[0] + "_expert_load.png"))


def expert_load_heat_map(records, out):
    """Heat map of the histograms in `records` (each {"step", "moe_tokens_per_expert": [layers][E],
    "moe_layers": [{"layer": block}, ...]}): rows (layer, expert), columns steps, load / layer mean."""
    import numpy as np

    steps = [r["step"] for r in records]
    hist = np.array([r["moe_tokens_per_expert"] for r in records], dtype=float)  # [steps, layers, E]
    mean = hist.mean(axis=2, keepdims=True)
    rel = np.divide(hist, mean, out=np.zeros_like(hist), where=mean > 0)
    n_steps, n_layers, n_experts = rel.shape
    grid = rel.transpose(1, 2, 0).reshape(n_layers * n_experts, n_steps)
    blocks = [m["layer"] for m in records[0].get("moe_layers", [])] or list(range(n_layers))
    fig, ax = plt.subplots(figsize=(8, max(3, 0.12 * n_layers * n_experts + 1.5)))
    from matplotlib.colors import TwoSlopeNorm

    norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=max(2.0, float(grid.max())))  # white = balanced
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="coolwarm", norm=norm,
                   extent=(-0.5, n_steps - 0.5, n_layers * n_experts - 0.5, -0.5))
    for i in range(1, n_layers):
        ax.axhline(i * n_experts - 0.5, color="black", lw=0.8)
    ax.set_yticks([i * n_experts + (n_experts - 1) / 2 for i in range(n_layers)])
    ax.set_yticklabels([f"layer {b}" for b in blocks])
    ticks = list(range(0, n_steps, max(1, n_steps // 10)))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(steps[t]) for t in ticks])
    ax.set_xlabel("step")
    ax.set_title(f"tokens per expert / layer mean ({n_experts} experts per layer; 1 = balanced)")
    fig.colorbar(im, ax=ax, label="load / mean")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out


if __name__ == "__main__":
    main()
