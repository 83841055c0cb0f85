#!/usr/bin/env python3
"""Damaged checkpoints through the real binary (4 ranks, FSDP): a run saves steps 3 and 6, then
each case damages a copy of the folder and resumes from it.

- a flipped byte inside one shard's data: refused (status 2, one line naming the file, the
  dataset and the checksum), on the writer's layout (checked on the read path) and on TP 2 x FSDP 2
  (checked by the re-read of shards no rank read whole);
- a truncated file: refused, naming the file;
- a checkpoint of another model shape: refused, naming the dataset and both shapes;
- `latest` naming a missing file: refused, naming the pointer;
- on_corrupt = previous with the flipped byte: says so, resumes from step 3 and trains on;
- `meshtrain ckpt inspect` reports the intact file (exit 0) and the flipped one (exit 2).

usage: corrupt.py --meshtrain BIN --deck DECK --data H5 --out DIR [-- overrides]
"""
import os
import shutil
import subprocess
import sys

import h5py

sys.dont_write_bytecode = True


def run(args, folder, extra):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", args.meshtrain, "train", "--deck", args.deck,
           f"--training.dataset={args.data}", f"--job.dump_folder={folder}", "--checkpoint.enable=true",
           "--checkpoint.interval=3"] + args.extra + extra
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def error_lines(res):
    return [l for l in res.stderr.splitlines() if "] error:" in l]


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "equivalence"))
    from compare_runs import run_arguments
    args = run_arguments(__doc__).parse_args()
    base = os.path.join(args.out, "base")
    shutil.rmtree(args.out, ignore_errors=True)
    res = run(args, base, ["--training.steps=6"])
    if res.returncode != 0:
        sys.exit(f"FAIL: the base run failed\n{res.stdout}\n{res.stderr}")
    step6 = "step-00000006.h5"
    failed = False

    def case(name, damage, extra, want_rc, want):
        nonlocal failed
        folder = os.path.join(args.out, name)
        shutil.copytree(base, folder)
        ck = os.path.join(folder, "checkpoints")
        damage(ck)
        res = run(args, folder, ["--training.steps=8"] + extra)
        lines = error_lines(res)
        text = res.stdout + res.stderr
        ok = res.returncode == want_rc and all(w in text for w in want)
        if want_rc != 0:
            ok = ok and len(lines) == 1  # one line, printed once
        failed |= not ok
        shown = lines[0] if lines else text.strip().splitlines()[-1] if text.strip() else ""
        print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {res.returncode}: {shown}")
        if not ok:
            print(text)

    def flip_byte(ck):
        path = os.path.join(ck, step6)
        with h5py.File(path, "r") as f:
            ds = f["model/layers.0.attention.wq.weight"]
            offset = ds.id.get_offset() + 4 * 100  # element 100 of the dataset
        with open(path, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x40]))

    def truncate(ck):
        path = os.path.join(ck, step6)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)

    def dangling(ck):
        os.remove(os.path.join(ck, step6))

    case("flipped_byte", flip_byte, [], 2,
         [step6, "dataset /model/layers.0.attention.wq.weight", "fails its checksum"])
    # Read on another layout (TP 2 x FSDP 2: no read is a whole written shard), the damaged shard is
    # caught by the round-robin re-read instead of the read path.
    case("flipped_byte_elastic", flip_byte, ["--parallelism.tensor_parallel_degree=2"], 2,
         [step6, "dataset /model/layers.0.attention.wq.weight", "fails its checksum"])
    case("truncated", truncate, [], 2, [step6])
    case("other_model", lambda ck: None, ["--model.dim=32"], 2,
         [step6, "has shape", "the model needs"])
    case("dangling_latest", dangling, [], 2, ["latest", "names " + step6 + ", which does not exist"])
    case("fallback_to_previous", flip_byte, ["--checkpoint.on_corrupt=previous"], 0,
         ["fails its checksum", "resuming from the previous good checkpoint", "step-00000003.h5", "step 8/8"])
    # meshtrain ckpt inspect: the verdict and the status follow the checksums.
    for name, want_rc, want in (("base", 0, "all match"), ("flipped_byte", 2, "checksums: FAILED")):
        res = subprocess.run([args.meshtrain, "ckpt", "inspect", os.path.join(args.out, name, "checkpoints", step6)],
                             capture_output=True, text=True)
        ok = (res.returncode == want_rc and want in res.stdout and "train state: step 6" in res.stdout
              and "/model/layers.0.attention.wq.weight  [64, 64] float32" in res.stdout)
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} ckpt inspect {name}: exit {res.returncode}: {res.stdout.strip().splitlines()[-1]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
