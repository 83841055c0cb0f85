#!/usr/bin/env python3
"""Checks a short run's metrics.jsonl: the first loss is that of a uniform guess over the
vocabulary (ln V, within 1 nat: the model starts untrained), every loss is finite, and the last
training loss is below the first. usage: check_loss_falls.py METRICS.jsonl VOCAB"""
import json
import math
import sys

records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
losses = [r["loss"] for r in records if "loss" in r and "step" in r]
vocab = int(sys.argv[2])
print(f"losses: {[round(x, 3) for x in losses]}; ln({vocab}) = {math.log(vocab):.3f}")
ok = losses and all(math.isfinite(x) for x in losses) and abs(losses[0] - math.log(vocab)) < 1.0 and losses[-1] < losses[0]
sys.exit(0 if ok else 1)
