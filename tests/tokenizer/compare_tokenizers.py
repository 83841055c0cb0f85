#!/usr/bin/env python3
"""meshtrain's tokenizer against a reference implementation, token for token.

Runs tokenizer_encode (meshtrain) and reference_encode.mjs (Hugging Face's JavaScript tokenizers,
or tiktoken compiled to WebAssembly) on the same files, then checks for every document (each
file whole and each of its lines) that the ids are identical and that meshtrain's
decode(encode(x)) gives x back (NFC(x) with --nfc: a tokenizer whose normalizer is NFC).
Prints a summary line; on a mismatch prints the document, the first differing position and the
tokens around it, and exits 1.

usage: compare_tokenizers.py --encoder BIN --node-modules DIR --mode hf|tiktoken --model PATH
                             [--nfc] FILE_OR_DIR...
"""
import argparse
import json
import os
import shutil
import subprocess
import sys


def run_lines(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    return [json.loads(line) for line in out.decode("utf-8").split("\n") if line]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", required=True)
    ap.add_argument("--node-modules", required=True)
    ap.add_argument("--mode", choices=["hf", "tiktoken"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--nfc", action="store_true")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    files = []
    for p in a.inputs:
        files += sorted(os.path.join(p, f) for f in os.listdir(p)) if os.path.isdir(p) else [p]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_encode.mjs")
    # An ES module finds packages in the node_modules beside it: run a copy there.
    copy = os.path.join(os.path.dirname(os.path.abspath(a.node_modules)), "reference_encode.mjs")
    shutil.copyfile(script, copy)
    ours = run_lines([a.encoder, a.model] + files)
    ref = run_lines(["node", copy, a.mode, a.model] + files)
    if len(ours) != len(ref):
        sys.exit(f"document count differs: meshtrain {len(ours)}, reference {len(ref)}")
    tokens = bad = bad_roundtrip = 0
    for o, r in zip(ours, ref):
        assert o["doc"] == r["doc"], (o["doc"], r["doc"])
        tokens += len(r["ids"])
        if o["ids"] != r["ids"]:
            bad += 1
            if bad <= 3:
                i = next((k for k, (x, y) in enumerate(zip(o["ids"], r["ids"])) if x != y), min(len(o["ids"]), len(r["ids"])))
                print(f"MISMATCH {o['doc']}: first difference at token {i} of {len(r['ids'])}\n"
                      f"  meshtrain: {o['ids'][max(0, i - 3):i + 5]}\n  reference: {r['ids'][max(0, i - 3):i + 5]}")
        want = r["nfc"] if a.nfc else r["text"]
        if o["decoded"] != want:
            bad_roundtrip += 1
            if bad_roundtrip <= 3:
                print(f"ROUND TRIP {o['doc']}: decode(encode(x)) != x{' (NFC)' if a.nfc else ''}")
    print(f"{a.mode} {a.model}: {len(ref)} documents from {len(files)} files, {tokens} tokens; "
          f"id mismatches: {bad} documents; round-trip failures: {bad_roundtrip}")
    sys.exit(1 if bad or bad_roundtrip else 0)


if __name__ == "__main__":
    main()
