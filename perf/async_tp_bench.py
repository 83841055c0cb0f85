#!/usr/bin/env python3
"""perf/async_tp_bench: step time of synchronous vs asynchronous tensor parallelism
([parallelism] enable_async_tensor_parallel), measured in the same run. It trains the debug
model's shapes (dim --dim, --layers blocks, seq_len --seq, micro-batch --local-batch) at tp --tp
with sequence parallelism, --rounds times each mode, alternating sync and async so that drifts of
the machine's load fall on both, and reports per mode the median step time over every timed step
(the first two of each run are not timed), tokens/s per rank, and the ratio async / sync step
time (below 1: async TP is faster).

Async TP cuts each block's all-gather / reduce-scatter into tp ring steps and overlaps each
step's transfer with the matmul of a row block already received (model/async_tensor_parallel.hpp);
the gain is bounded by the share of the step spent in the tp collectives. Ranks run --threads
OpenMP/BLAS threads each; on a machine with fewer cores than ranks × threads the ranks share
cores, so a rank waiting for its neighbour's transfer frees a core rather than hiding it, and the
ratio says little about a GPU node's. A benchmark, not a test: nothing here asserts on time.

usage: /usr/bin/python3 perf/async_tp_bench.py [--tp 2] [--dim 256] [--layers 2] [--seq 512]
           [--local-batch 2] [--steps 8] [--rounds 3] [--threads 1] [--data H5] [--out DIR]
           [--json PATH] [--binary build/bin/meshtrain]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_volume import ROOT, add_run_arguments, ensure_data, machine, train, write_result  # noqa: E402

DECK = os.path.join(ROOT, "inputs/llama3_debug.toml")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--local-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    add_run_arguments(p, "async_tp_bench")
    a = p.parse_args()
    if a.steps < 4:
        p.error("--steps must be >= 4 (the first two are not timed)")
    if a.tp < 2:
        p.error("--tp must be >= 2 (async TP has no effect with tp 1)")
    data = ensure_data(a.data, a.out, a.binary, ndocs=150)
    common = [f"--model.dim={a.dim}", f"--model.n_layers={a.layers}", "--model.vocab_size=512",
              f"--training.seq_len={a.seq}", f"--training.local_batch_size={a.local_batch}",
              f"--training.global_batch_size={a.local_batch}", f"--training.steps={a.steps}",
              f"--parallelism.tensor_parallel_degree={a.tp}", "--parallelism.data_parallel_shard_degree=1",
              "--lr_scheduler.warmup_steps=1", "--job.final_dump=false"]
    times = {"sync": [], "async": []}
    tokens_per_s = {"sync": [], "async": []}
    for r in range(a.rounds):
        for mode in ("sync", "async"):
            tag = f"{mode}-round{r}"
            print(f"running {tag}", flush=True)
            over = common + [f"--parallelism.enable_async_tensor_parallel={'true' if mode == 'async' else 'false'}"]
            recs, _, err = train(a.binary, DECK, data, os.path.join(a.out, tag), a.tp, over, threads=a.threads,
                                 timeout=a.timeout)
            if err:
                sys.exit(f"{tag}: {err}")
            times[mode] += [x["step_time_s"] for x in recs[2:]]
            tokens_per_s[mode] += [x["tokens_per_s_per_rank"] for x in recs[2:]]
    med = {m: statistics.median(times[m]) for m in times}
    ratio = med["async"] / med["sync"]
    print(f"\ntp {a.tp}, dim {a.dim}, {a.layers} blocks, seq_len {a.seq}, micro-batch {a.local_batch}, "
          f"{a.threads} thread(s) per rank; {machine()}; {a.rounds} runs x {a.steps - 2} timed steps per mode\n")
    print(f"{'mode':6} {'step s':>8} {'min s':>8} {'max s':>8} {'tok/s/rank':>10}")
    for m in ("sync", "async"):
        print(f"{m:6} {med[m]:8.4f} {min(times[m]):8.4f} {max(times[m]):8.4f} "
              f"{statistics.median(tokens_per_s[m]):10.0f}")
    print(f"\nratio async / sync step time: {ratio:.3f}")
    write_result(a.json, {"tp": a.tp, "dim": a.dim, "layers": a.layers, "seq_len": a.seq,
                          "local_batch": a.local_batch, "threads": a.threads, "rounds": a.rounds,
                          "steps": a.steps, "step_time_s": med, "step_times_s": times, "ratio": ratio})
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
