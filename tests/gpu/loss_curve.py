#!/usr/bin/env python3
"""200 steps of a debug deck on the GPU (bf16 mixed precision by default) follow the CPU
(float32 reference) loss curve: at every logged step |loss_gpu - loss_cpu| / loss_cpu <= --tol
(2%), and the final validation losses too. Exits 77 (ctest SKIPPED) when this meshtrain has no
CUDA backend or no GPU is visible, which it learns from meshtrain itself (a 1-step probe run).

Usage: loss_curve.py --meshtrain BIN --deck DECK --data TOKENS.h5 --out DIR [--steps 200]
       [--precision bfloat16|float32] [--tol 0.02] [--np N --mpirun MPIRUN]
       [--cpu-metrics METRICS.jsonl | --write-cpu-metrics METRICS.jsonl] [-- extra overrides]
An extra override written `cuda:--KEY=VALUE` goes to the GPU runs only, one written
`cpu:--KEY=VALUE` to the CPU run only (e.g. `cpu:--quantize.linear.float8.emulate=true
cuda:--quantize.linear.float8.emulate=false`: FP8 GEMMs on the GPU against the CPU's emulation,
the only Float8 mode the CPU device has; a key may be given once per run).
With --np N both runs use N ranks under mpirun (on one GPU the ranks share it and collectives
go through host-staged MPI), so FSDP and TP run their GPU code paths.
--cpu-metrics takes the CPU curve from an earlier run of the same deck, data, steps and
overrides (its metrics.jsonl) instead of running it here: a GPU window then spends its minutes
on the GPU run only; --write-cpu-metrics runs only the CPU curve and saves it there (no GPU
needed: make the references before the window). Each phase prints a line as it ends, so a run stopped at a time limit
still shows how far it got.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

SKIP = 77


def say(msg):
    print(msg, flush=True)


def device_overrides(extra, device):
    """The overrides of `extra` for a run on `device`: the unprefixed ones and those prefixed
    `device:` (prefix removed); those prefixed with another device's name are left out."""
    out = []
    for x in extra:
        prefix, sep, rest = x.partition(":")
        if sep and prefix in ("cpu", "cuda") and rest.startswith("--"):
            if prefix == device:
                out.append(rest)
        else:
            out.append(x)
    return out


def run(a, out, device, precision, steps):
    bin_, deck, data = a.meshtrain, a.deck, a.data
    extra = device_overrides(a.extra, device)
    shutil.rmtree(out, ignore_errors=True)
    launch = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(a.np)] if a.np > 1 else []
    cmd = launch + [bin_, "train", "--deck", deck, f"--training.dataset={data}", f"--job.dump_folder={out}",
           f"--training.device={device}", f"--training.mixed_precision_param={precision}",
           f"--training.steps={steps}", "--checkpoint.enable=false", "--metrics.log_freq=10",
           f"--validation.freq={steps}", "--validation.steps=4"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p, os.path.join(out, "metrics.jsonl")


def curve(path):
    train, val = {}, None
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r and "step" in r:
                train[r["step"]] = r["loss"]
            if "val_loss" in r:
                val = r["val_loss"]
    return train, val


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--deck", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--cpu-metrics", help="metrics.jsonl of the CPU reference run (skips running it)")
    ap.add_argument("--write-cpu-metrics", help="run only the CPU curve and copy its metrics.jsonl here")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()

    if a.write_cpu_metrics:
        t0 = time.monotonic()
        p, metrics = run(a, os.path.join(a.out, "cpu"), "cpu", "float32", a.steps)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            print(f"FAIL: the cpu run exited with status {p.returncode}")
            return 1
        shutil.copyfile(metrics, a.write_cpu_metrics)
        say(f"cpu: {a.steps} steps ran ({time.monotonic() - t0:.1f} s), curve saved to {a.write_cpu_metrics}")
        return 0

    t0 = time.monotonic()
    probe, _ = run(a, os.path.join(a.out, "probe"), "cuda", a.precision, 1)
    if probe.returncode != 0:
        msg = probe.stderr + probe.stdout
        if "built without CUDA" in msg or "no GPU is visible" in msg:
            why = [l for l in msg.splitlines() if "built without CUDA" in l or "no GPU is visible" in l]
            print("SKIPPED: " + why[0].strip())
            return SKIP
        print(msg)
        print("FAIL: the 1-step GPU probe run failed")
        return 1
    say(f"probe: 1 GPU step ran ({time.monotonic() - t0:.1f} s)")

    results = {}
    if a.cpu_metrics:
        results["cpu"] = curve(a.cpu_metrics)
        say(f"cpu: reference curve read from {a.cpu_metrics} ({len(results['cpu'][0])} logged steps)")
    runs = (("cuda", a.precision),) if a.cpu_metrics else (("cpu", "float32"), ("cuda", a.precision))
    for device, precision in runs:
        t0 = time.monotonic()
        p, metrics = run(a, os.path.join(a.out, device), device, precision, a.steps)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            print(f"FAIL: the {device} run exited with status {p.returncode}")
            return 1
        results[device] = curve(metrics)
        say(f"{device}: {a.steps} steps ran ({time.monotonic() - t0:.1f} s)")

    (cpu, cpu_val), (gpu, gpu_val) = results["cpu"], results["cuda"]
    worst, failures = 0.0, []
    print(f"{'step':>6} {'cpu loss':>10} {'gpu loss':>10} {'rel diff':>9}")
    for step in sorted(cpu):
        if step not in gpu:
            failures.append(f"step {step}: no GPU record")
            continue
        d = abs(gpu[step] - cpu[step]) / abs(cpu[step])
        worst = max(worst, d)
        print(f"{step:>6} {cpu[step]:>10.4f} {gpu[step]:>10.4f} {d:>9.4%}")
        if d > a.tol:
            failures.append(f"step {step}: cpu {cpu[step]:.4f} gpu {gpu[step]:.4f} ({d:.2%} > {a.tol:.0%})")
    if cpu_val is None or gpu_val is None:
        failures.append("no validation loss recorded")
    else:
        dv = abs(gpu_val - cpu_val) / abs(cpu_val)
        print(f"final val_loss cpu {cpu_val:.4f} gpu {gpu_val:.4f} ({dv:.3%})")
        if dv > a.tol:
            failures.append(f"val_loss: cpu {cpu_val:.4f} gpu {gpu_val:.4f} ({dv:.2%} > {a.tol:.0%})")
    print(f"worst train-loss difference {worst:.3%} over {len(cpu)} logged steps ({a.precision} on the GPU)")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
