#!/usr/bin/env python3
"""meshtrain plan's memory prediction against the allocator's measured peaks, layout by layout.

For each layout (DDP, FSDP, ZeRO-1/2, HSDP, TP and TP without sequence parallelism, TP x FSDP,
pipeline schedules (zero-bubble ones included), pipeline x FSDP and x ZeRO-2, CP with both
rotate methods, MoE with and without expert parallelism, full and per-operator activation checkpointing,
chunked cross-entropy) on a model: train 2 steps on CPU ranks,
read the summary's memory_peak_bytes_by_category (largest rank per category) and the largest
step record's memory_peak_bytes, and ask `meshtrain plan --fixed all --json` for the same deck and overrides.
  parameters, gradients, optimizer: equal to the byte;
  activations and the total:        within --tol (5%).
The communication category is printed but not checked: when an asynchronous reduce-scatter
retires depends on timing, so its peak varies from run to run by one unit's buffer.

usage: memory_accuracy.py --meshtrain BIN --data H5 --out DIR --model debug|wide [--tol 0.05] [--layouts NAME ...]
"""
import argparse
import json
import os
import subprocess
import sys

P = "--parallelism."
MOE = ["--model.n_layers=4", "--model.n_dense_layers=1", "--model.num_experts=8", "--model.top_k=2",
       "--model.moe_inter_dim=48", "--model.num_shared_experts=1", "--debug.moe_force_load_balance=true"]
MODELS = {
    # The equivalence tests' tiny Llama (dim 64, 2 blocks, vocab 512).
    "debug": [],
    # Wider: activations and state well above the cpu backend's 12 MiB start-up probe.
    "wide": ["--model.dim=256", "--model.n_heads=8", "--model.n_kv_heads=4", "--model.vocab_size=2048",
             "--training.seq_len=128"],
}


def pp2(tag, dp_shard, schedule, extra=()):
    """A pp 2 layout of 4 blocks (local batch 4: 4 micro-batches) over dp_shard replicas."""
    return (tag, 2 * dp_shard, ["--training.local_batch_size=4", f"--training.global_batch_size={4 * dp_shard}",
                                "--model.n_layers=4", P + "pipeline_parallel_degree=2",
                                P + f"data_parallel_shard_degree={dp_shard}",
                                P + f"pipeline_parallel_schedule={schedule}"] + list(extra))


# name, ranks, overrides (local batch, global batch, then the layout)
LAYOUTS = [
    ("single", 1, ["--training.local_batch_size=2", "--training.global_batch_size=2"]),
    ("single_full_ac", 1, ["--training.local_batch_size=2", "--training.global_batch_size=2",
                           "--activation_checkpoint.mode=full"]),
    ("single_op_ac", 1, ["--training.local_batch_size=2", "--training.global_batch_size=2",
                         "--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op"]),
    # Chunked cross-entropy: the head's logits one [256, vocab] chunk at a time, lse kept.
    ("single_chunked_ce", 1, ["--training.local_batch_size=16", "--training.global_batch_size=16",
                              "--model.loss_chunk_tokens=256"]),
    ("ddp2", 2, ["--training.local_batch_size=1", "--training.global_batch_size=2",
                 P + "data_parallel_replicate_degree=2", P + "data_parallel_shard_degree=1"]),
    ("fsdp4", 4, ["--training.local_batch_size=1", "--training.global_batch_size=4"]),
    ("zero1_2", 2, ["--training.local_batch_size=1", "--training.global_batch_size=2", P + "zero_stage=1"]),
    ("zero2_2", 2, ["--training.local_batch_size=1", "--training.global_batch_size=2", P + "zero_stage=2"]),
    ("hsdp2x2", 4, ["--training.local_batch_size=1", "--training.global_batch_size=4",
                    P + "data_parallel_replicate_degree=2", P + "data_parallel_shard_degree=2"]),
    ("tp2", 2, ["--training.local_batch_size=2", "--training.global_batch_size=2", P + "tensor_parallel_degree=2",
                P + "data_parallel_shard_degree=1"]),
    ("tp2_nosp", 2, ["--training.local_batch_size=2", "--training.global_batch_size=2",
                     P + "tensor_parallel_degree=2", P + "data_parallel_shard_degree=1",
                     P + "enable_sequence_parallel=false"]),
    ("tp2_fsdp2", 4, ["--training.local_batch_size=1", "--training.global_batch_size=2", P + "tensor_parallel_degree=2"]),
    pp2("pp2_1f1b", 1, "1F1B"),
    pp2("pp2_gpipe", 1, "GPipe"),
    pp2("pp2_interleaved", 1, "Interleaved1F1B"),
    # Pipelined ZeRO-3 and ZeRO-2 keep every unit's unsharded gradients for the whole step.
    pp2("pp2_fsdp2", 2, "1F1B"),
    pp2("pp2_zero2_2", 2, "1F1B", [P + "zero_stage=2"]),
    # Zero-bubble: the split backward's weight-gradient operands live from I to W.
    pp2("pp2_zbv", 1, "ZBVZeroBubble"),
    pp2("pp2_izb", 1, "InterleavedZeroBubble", ["--model.n_layers=8"]),
    pp2("pp2_fsdp2_zbv", 2, "ZBVZeroBubble"),
    # Two rounds of micro-batches: the second runs with every stage's gradients alive.
    pp2("pp2_fsdp2_zbv_ga2", 2, "ZBVZeroBubble", ["--training.global_batch_size=16"]),
    ("cp2_allgather", 2, ["--training.local_batch_size=2", "--training.global_batch_size=2",
                          P + "context_parallel_degree=2", P + "data_parallel_shard_degree=1"]),
    ("cp2_ring", 2, ["--training.local_batch_size=2", "--training.global_batch_size=2", P + "context_parallel_degree=2",
                     P + "data_parallel_shard_degree=1", P + "context_parallel_rotate_method=alltoall"]),
    ("moe", 1, ["--training.local_batch_size=2", "--training.global_batch_size=2"] + MOE),
    ("moe_tp2", 2, ["--training.local_batch_size=2", "--training.global_batch_size=2", P + "tensor_parallel_degree=2",
                    P + "data_parallel_shard_degree=1"] + MOE),
    ("moe_ep2", 2, ["--training.local_batch_size=1", "--training.global_batch_size=2", P + "expert_parallel_degree=2"]
     + MOE),
]


def train(a, tag, np_, over, steps=2):
    """Trains `steps` steps of a.deck on np_ CPU ranks into a.out/tag; returns metrics.jsonl's records."""
    out = os.path.join(a.out, tag)
    subprocess.run(["rm", "-rf", out], check=True)
    cmd = (["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)] if np_ > 1 else []) + [
        a.meshtrain, "train", "--deck", a.deck, f"--training.dataset={a.data}", f"--job.dump_folder={out}",
        f"--training.steps={steps}", "--validation.enable=false", "--checkpoint.enable=false",
        "--metrics.log_freq=1"] + over
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        sys.exit(f"{tag}: training failed\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def plan_fixed(a, tag, np_, over, extra=()):
    """`meshtrain plan --fixed all` for the same deck and overrides: the deck's own configuration."""
    js = os.path.join(a.out, tag + ".plan.json")
    cmd = [a.meshtrain, "plan", "--deck", a.deck, "--gpus", str(np_), "--fixed", "all", "--json", js,
           f"--training.dataset={a.data}"] + list(extra) + over
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{tag}: meshtrain plan failed\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    top = json.load(open(js))["top"]
    if len(top) != 1:
        sys.exit(f"{tag}: plan --fixed all returned {len(top)} configurations, expected the deck's own")
    return top[0]


def measure(a, tag, np_, over):
    recs = train(a, tag, np_, over)
    cats = dict(recs[-1]["memory_peak_bytes_by_category"])
    cats["total"] = max(r["memory_peak_bytes"] for r in recs if "loss" in r)
    return cats


def predict(a, tag, np_, over):
    return plan_fixed(a, tag, np_, over)["memory_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--deck", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--layouts", nargs="+", choices=[tag for tag, _, _ in LAYOUTS],
                    help="run only these layouts (default: all)")
    a = ap.parse_args()
    layouts = [entry for entry in LAYOUTS if not a.layouts or entry[0] in a.layouts]
    os.makedirs(a.out, exist_ok=True)
    failed = []
    print(f"{'layout':<18} {'category':<14} {'measured':>12} {'predicted':>12} {'error':>8}")
    for tag, np_, layout in layouts:
        over = MODELS[a.model] + layout
        m, p = measure(a, tag, np_, over), predict(a, tag, np_, over)
        for cat in ("parameters", "gradients", "optimizer", "activations", "communication", "total"):
            err = (p[cat] - m[cat]) / m[cat] if m[cat] else float(p[cat] != 0)
            exact = cat in ("parameters", "gradients", "optimizer")
            ok = (p[cat] == m[cat]) if exact else (cat == "communication" or abs(err) <= a.tol)
            rule = "exact" if exact else ("(not checked)" if cat == "communication" else f"<= {a.tol:.0%}")
            print(f"{tag:<18} {cat:<14} {m[cat]:>12} {p[cat]:>12} {err:>+8.2%} {rule}{'' if ok else '  FAIL'}")
            if not ok:
                failed.append(f"{tag} {cat}")
    if failed:
        sys.exit("FAIL: " + ", ".join(failed))
    print(f"all {len(layouts)} layouts: state exact, activations and total within {a.tol:.0%}")


if __name__ == "__main__":
    main()
