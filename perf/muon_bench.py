#!/usr/bin/env python3
"""perf/muon_bench: what Muon costs and what it buys, against AdamW measured in the same run.

1. Step time: the Llama 3 debug model (inputs/llama3_debug.toml: dim 256, 6 layers, vocabulary
   2048, seq_len 128, 8 samples per rank) under FSDP at 1, 2 and 4 ranks, AdamW then Muon, the
   median step time over the steps after the first two; the ratio Muon / AdamW is the overhead
   (Newton-Schulz on each matrix's owner plus the gather/scatter all-to-alls). The Newton-Schulz
   flops of the whole model per step (optim/newton_schulz.hpp's count) are printed beside the
   model's training flops per rank (flops_per_token * tokens) for scale.
2. Loss: make run's deck (the same model on the Brown corpus) for --loss-steps steps at 2 ranks,
   AdamW against Muon at the same lr (Moonlight's 0.2 * sqrt(max(m, n)) scale is meant to let
   AdamW's lr and weight decay carry over), same tokens: training loss (mean of the last 10 steps)
   and the validation loss at the end.

usage: /usr/bin/python3 perf/muon_bench.py [--ranks 1 2 4] [--steps 12] [--loss-steps 300]
           [--data data/brown.h5] [--binary build/bin/meshtrain] [--out perf/out/muon] [--json PATH]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_volume import ROOT, add_run_arguments, model_shape, train, write_result  # noqa: E402

DECK = os.path.join(ROOT, "inputs/llama3_debug.toml")


def ns_flops(m, steps=5):
    """Newton-Schulz flops of one Muon step over every hidden matrix of a dense model."""
    D, L, Hq, Hkv, H = m["dim"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["ffn_dim"]
    Dh = m.get("head_dim") or D // Hq
    mats = [(Hq * Dh, D), (Hkv * Dh, D), (Hkv * Dh, D), (D, Hq * Dh), (H, D), (D, H), (H, D)]
    total = 0
    for r, c in mats:
        k, l = min(r, c), max(r, c)
        total += steps * (4 * k * k * l + 2 * k ** 3)
    return L * total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--loss-steps", type=int, default=300)
    p.add_argument("--loss-ranks", type=int, default=2)
    add_run_arguments(p, "muon")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data = args.data or os.path.join(ROOT, "data/brown.h5")
    if not os.path.exists(data):
        sys.exit(f"{data} missing: `make corpus` writes the Brown corpus store")
    m = model_shape(args.binary, DECK)
    rows, failed = [], False
    print(f"{'ranks':>5} {'AdamW s/step':>13} {'Muon s/step':>12} {'Muon/AdamW':>11}")
    for n in args.ranks:
        times = {}
        for opt in ("AdamW", "Muon"):
            over = [f"--optimizer.name={opt}", f"--training.steps={args.steps}",
                    f"--parallelism.data_parallel_shard_degree={n}", "--lr_scheduler.warmup_steps=2"]
            recs, summary, err = train(args.binary, DECK, data, os.path.join(args.out, f"time-{opt}-np{n}"), n, over)
            if err:
                print(err)
                failed = True
                continue
            times[opt] = statistics.median(r["step_time_s"] for r in recs[2:])
        if len(times) == 2:
            ratio = times["Muon"] / times["AdamW"]
            print(f"{n:5} {times['AdamW']:13.4f} {times['Muon']:12.4f} {ratio:11.3f}")
            rows.append({"ranks": n, "adamw_step_s": times["AdamW"], "muon_step_s": times["Muon"], "ratio": ratio})
    tokens = 8 * 128
    print(f"Newton-Schulz flops per step (whole model, split over the owners): {ns_flops(m):.3e}; "
          f"training flops per rank and step (flops_per_token * tokens): {m['flops_per_token'] * tokens:.3e}")
    loss = {}
    n = args.loss_ranks
    for opt in ("AdamW", "Muon"):
        over = [f"--optimizer.name={opt}", f"--training.steps={args.loss_steps}",
                f"--parallelism.data_parallel_replicate_degree={n}", "--validation.enable=true",
                f"--validation.freq={args.loss_steps}", "--validation.steps=-1"]
        out = os.path.join(args.out, f"loss-{opt}-np{n}")
        recs, summary, err = train(args.binary, DECK, data, out, n, over)
        if err:
            print(err)
            failed = True
            continue
        # train() turns validation off; its overrides come first, ours win.
        val = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"val_loss"' in l]
        loss[opt] = {"train_loss_last10": statistics.mean(r["loss"] for r in recs[-10:]),
                     "val_loss": val[-1]["val_loss"] if val else None,
                     "tokens": summary.get("tokens") if summary else None}
    for opt, v in loss.items():
        print(f"{opt:5}: {args.loss_steps} steps at {n} ranks, {v['tokens']} tokens: train loss (last 10) "
              f"{v['train_loss_last10']:.4f}, validation loss {v['val_loss']}")
    write_result(args.json, {"step_time": rows, "loss": loss, "ns_flops_per_step": ns_flops(m),
                             "loss_steps": args.loss_steps, "loss_ranks": n})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
