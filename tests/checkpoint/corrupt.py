#!/usr/bin/env python3
"""Damaged checkpoints through the real binary (4 ranks, FSDP): a run saves steps 3 and 6, then
each case damages a copy of the folder and resumes from it.

- a flipped byte inside one shard's data: refused (status 2, one line naming the file, the
  dataset and the checksum), on the writer's layout (checked on the read path) and on TP 2 x FSDP 2
  (checked by the re-read of shards no rank read whole);
- a truncated file: refused, naming the file;
- a checkpoint of another model shape: refused, naming the dataset and both shapes;
- `latest` naming a missing file: refused, naming the pointer;
- a damaged /dataset_offsets (the table loads plan their reads from): refused, naming it; a table
  that passes its own checksum but swaps two datasets' offsets steers the reads to the wrong bytes,
  which the shards' checksums refuse; a file
  without the table (as written before it existed) resumes through HDF5 and trains to the same
  losses as the intact file, also on TP 2 x FSDP 2;
- on_corrupt = previous with the flipped byte: says so, resumes from step 3 and trains on;
- `meshtrain ckpt inspect` reports the intact file (exit 0) and the flipped one (exit 2).

usage: corrupt.py --meshtrain BIN --deck DECK --data H5 --out DIR [-- overrides]
"""
import os
import shutil
import subprocess
import sys

import ctypes

import h5py
import numpy

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

    def damage_table(ck):
        with h5py.File(os.path.join(ck, step6), "r+") as f:
            ds = f["dataset_offsets"]
            text = bytearray(ds[()])
            tab = text.index(b"\t")  # the first line's offset starts after its name
            text[tab + 1] = ord("9") if text[tab + 1] != ord("9") else ord("8")
            ds[...] = numpy.frombuffer(bytes(text), dtype=numpy.uint8)

    def drop_table(ck):
        with h5py.File(os.path.join(ck, step6), "r+") as f:
            del f["dataset_offsets"]

    case("offsets_table_damaged", damage_table, [], 2, [step6, "/dataset_offsets fails its checksum"])

    def swap_in_table(ck):
        xxh = ctypes.CDLL("libxxhash.so.0")  # Debian's libxxhash, the library meshtrain hashes with
        xxh.XXH3_64bits.restype = ctypes.c_uint64
        xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        with h5py.File(os.path.join(ck, step6), "r+") as f:
            ds = f["dataset_offsets"]
            lines = bytes(ds[()]).decode().splitlines()
            rows = {l.split("\t")[0]: l.split("\t") for l in lines}
            a, b = rows["/model/layers.0.attention.wq.weight"], rows["/model/layers.0.attention.wo.weight"]
            a[1], b[1] = b[1], a[1]  # same shapes, each other's bytes
            text = "".join("\t".join(rows[l.split("\t")[0]]) + "\n" for l in lines).encode()
            ds[...] = numpy.frombuffer(text, dtype=numpy.uint8)
            ds.attrs.modify("xxh3_64", "%016x" % xxh.XXH3_64bits(text, len(text)))

    case("offsets_table_misleading", swap_in_table, [], 2, [step6, "attention.w", "fails its checksum"])
    case("offsets_table_misleading_tp2", swap_in_table, ["--parallelism.tensor_parallel_degree=2"], 2,
         [step6, "attention.w", "corrupt checkpoint"])
    # Without the table the reads are planned by opening every dataset, as before it existed: the
    # same resumed training, bit for bit, on the writer's layout and on another one.
    losses = {}
    for name, damage, extra in (("intact", lambda ck: None, []), ("no_offsets_table", drop_table, []),
                                ("intact_tp2", lambda ck: None, ["--parallelism.tensor_parallel_degree=2"]),
                                ("no_offsets_table_tp2", drop_table, ["--parallelism.tensor_parallel_degree=2"])):
        case(name, damage, extra, 0, ["step 8/8"])
        with open(os.path.join(args.out, name, "metrics.jsonl")) as f:
            losses[name] = [line for line in f if '"loss"' in line and '"step":8' in line.replace(" ", "")]
    for a, b in (("intact", "no_offsets_table"), ("intact_tp2", "no_offsets_table_tp2")):
        same = bool(losses[a]) and [l.split('"loss":')[1].split(",")[0] for l in losses[a]] == \
            [l.split('"loss":')[1].split(",")[0] for l in losses[b]]
        failed |= not same
        print(f"{'ok  ' if same else 'FAIL'} {b}: step 8's loss equals {a}'s")
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
