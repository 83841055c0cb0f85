#!/usr/bin/env python3
"""Draws loss, validation loss and tokens/s from a meshtrain metrics.jsonl into a PNG.

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
    train, val, summary = [], [], None
    with open(a.metrics) as f:
        for line in f:
            r = json.loads(line)
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


if __name__ == "__main__":
    main()
