#!/usr/bin/env python3
"""`meshtrain data prepare` under mpirun: the same store for any number of ranks, and bad input
stopped with one line.

Builds a small mixed corpus (JSON Lines plain and gzip, text files) from the Brown documents, then:
  1. prepares it with the Llama 3 tokenizer.json at -np 1, 2 and 3, and with a SentencePiece model
     trained on rank 0 (--vocab-size) at -np 1 and 3: every dataset and attribute of the stores
     equals the 1-rank store's (h5py);
  2. a JSON Lines file with a bad line: at -np 3 the command exits 2 with one line naming
     FILE:LINE, and leaves neither the store nor its .tmp; with --skip-bad-lines it succeeds and
     the summary counts the skipped line.
usage: parallel_prepare.py --meshtrain BIN --llama3 DIR --brown DIR --out DIR
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np


def prepare(a, np_, inputs, out, extra):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np_), a.meshtrain,
           "data", "prepare", "--input", *inputs, "--output", out, *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def contents(path):
    items = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                items[name] = (str(obj.dtype), obj[()].tobytes())
            for k, v in obj.attrs.items():
                items[f"{name}@{k}"] = v.tobytes() if isinstance(v, np.ndarray) else v
        f.visititems(visit)
        for k, v in f.attrs.items():
            items[f"/@{k}"] = v
    return items


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--llama3", required=True)
    ap.add_argument("--brown", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    corpus = os.path.join(a.out, "corpus")
    os.makedirs(corpus)
    docs = [open(os.path.join(a.brown, f), encoding="utf-8").read() for f in sorted(os.listdir(a.brown))[:60]]
    with open(os.path.join(corpus, "a.jsonl"), "w") as f:
        for d in docs[:25]:
            f.write(json.dumps({"text": d, "url": "x"}) + "\n")
    with gzip.open(os.path.join(corpus, "b.jsonl.gz"), "wt") as f:
        for d in docs[25:40]:
            f.write(json.dumps({"text": d}) + "\n")
    for i, d in enumerate(docs[40:]):
        with open(os.path.join(corpus, f"c{i:02d}.txt"), "w") as f:
            f.write(d)
    failures = []
    for label, extra, counts in (("llama3", ["--hf-assets-path", a.llama3], (1, 2, 3)),
                                 ("sentencepiece", ["--vocab-size", "512"], (1, 3))):
        stores = {}
        for n in counts:
            out = os.path.join(a.out, f"{label}_np{n}.h5")
            r = prepare(a, n, [corpus], out, extra)
            if r.returncode != 0:
                sys.exit(f"{label} -np {n} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
            stores[n] = contents(out)
        for n in counts[1:]:
            diff = sorted(k for k in set(stores[1]) | set(stores[n]) if stores[1].get(k) != stores[n].get(k))
            print(f"{label}: -np {n} store {'equals' if not diff else 'DIFFERS from'} -np 1 "
                  f"({len(stores[n])} datasets and attributes){': ' + ', '.join(diff) if diff else ''}")
            if diff:
                failures.append(f"{label} np {n}")
        with h5py.File(os.path.join(a.out, f"{label}_np1.h5"), "r") as f:
            print(f"  {label}: {f['train/doc_offsets'].shape[0] - 1} + {f['validation/doc_offsets'].shape[0] - 1} "
                  f"documents, tokens stored as {f['train/tokens'].dtype}, tokenizer {f['tokenizer'].attrs['type']}")
    bad = os.path.join(a.out, "bad")
    os.makedirs(bad)
    shutil.copy(os.path.join(corpus, "a.jsonl"), bad)
    with open(os.path.join(bad, "z.jsonl"), "w") as f:
        f.write(json.dumps({"text": docs[0]}) + "\n" + '{"text": "unterminated\n' + json.dumps({"text": docs[1]}) + "\n")
    out = os.path.join(a.out, "bad.h5")
    r = prepare(a, 3, [bad], out, ["--hf-assets-path", a.llama3])
    lines, banner = [], False  # mpirun's own report comes between lines of dashes
    for l in r.stderr.splitlines():
        if l.startswith("-----"):
            banner = not banner
        elif l.strip() and not banner:
            lines.append(l)
    want = os.path.join(bad, "z.jsonl") + ":2: not valid JSON"
    ok = r.returncode == 2 and len(lines) == 1 and lines[0].startswith(want) and not os.path.exists(out) \
        and not os.path.exists(out + ".tmp")
    print(f"bad line at -np 3: exit {r.returncode}, stderr {lines!r}, store left: {os.path.exists(out)}, "
          f".tmp left: {os.path.exists(out + '.tmp')}")
    if not ok:
        failures.append("bad line")
    r = prepare(a, 3, [bad], out, ["--hf-assets-path", a.llama3, "--skip-bad-lines"])
    print("--skip-bad-lines:", r.stdout.strip().splitlines()[0] if r.stdout.strip() else r.stderr)
    if r.returncode != 0 or "1 bad lines skipped" not in r.stdout:
        failures.append("skip-bad-lines")
    if failures:
        sys.exit("FAILED: " + ", ".join(failures))


if __name__ == "__main__":
    main()
