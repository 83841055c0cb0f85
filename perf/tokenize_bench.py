#!/usr/bin/env python3
"""perf/tokenize_bench: meshtrain's byte-level BPE tokenizer against tiktoken and Hugging Face's
JavaScript tokenizers on the same text in the same run, and `meshtrain data prepare` end to end.

Encoding (MB/s on one core, best of --rounds; every implementation encodes each Brown document
whole, the same 6 MB):
  meshtrain  Llama 3 tokenizer.json, Qwen3 tokenizer.json, Llama 3 as a tiktoken rank file
             (tests/tokenizer/encode_corpus.cpp --bench; a freshly loaded tokenizer each round,
             so its word cache starts cold every time)
  tiktoken   the Rust tiktoken compiled to WebAssembly (npm tiktoken), Llama 3's ranks, pattern
             and special tokens
  HF JS      @huggingface/tokenizers (Hugging Face's JavaScript implementation), the same
             tokenizer.json files
The ids are identical (tests/tokenizer); only the speed is compared here.
End to end: `meshtrain data prepare --hf-assets-path <Llama 3>` under mpirun -np 1 and 2 (read,
tokenize, write the store collectively; its own MB/s line) on a JSON Lines file of the Brown
documents repeated --copies times (default 8: 48 MB), FineWeb's shape on a small scale.
A benchmark, not a test: nothing asserts on time. Writes JSON (--json).

usage: /usr/bin/python3 perf/tokenize_bench.py [--build build] [--rounds 3] [--copies 8] [--json perf/out/tokenize_bench.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no perf/__pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_volume import ROOT, write_result  # noqa: E402


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--json", default=os.path.join(ROOT, "perf", "out", "tokenize_bench.json"))
    a = ap.parse_args()
    tk = os.path.join(a.build, "tests", "tokenizer")
    ref = os.path.join(tk, "ref")
    subprocess.run([os.path.join(ROOT, "tests", "tokenizer", "install_references.sh"), ref], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([os.path.join(ROOT, "scripts", "fetch-brown.sh"), os.path.join(tk, "brown")], check=True)
    texts = sorted(os.path.join(tk, "brown", "text", f) for f in os.listdir(os.path.join(tk, "brown", "text")))
    encoder = os.path.join(tk, "tokenizer_encode")
    node = ["node", os.path.join(ref, "reference_encode.mjs")]
    env = dict(os.environ, BENCH_ROUNDS=str(a.rounds))
    r = str(a.rounds)
    rows = [
        ("Llama 3 tokenizer.json", "meshtrain", run_json([encoder, "--bench", r, os.path.join(ref, "llama3")] + texts)),
        ("Llama 3 tokenizer.json", "HF JS", run_json(node + ["hf", os.path.join(ref, "llama3")] + texts, env)),
        ("Qwen3 tokenizer.json", "meshtrain", run_json([encoder, "--bench", r, os.path.join(ref, "qwen3")] + texts)),
        ("Qwen3 tokenizer.json", "HF JS", run_json(node + ["hf", os.path.join(ref, "qwen3")] + texts, env)),
        ("Llama 3 tiktoken ranks", "meshtrain",
         run_json([encoder, "--bench", r, os.path.join(ref, "llama3.tiktoken")] + texts)),
        ("Llama 3 tiktoken ranks", "tiktoken (wasm)",
         run_json(node + ["tiktoken", os.path.join(ref, "llama3.tiktoken")] + texts, env)),
    ]
    tiktoken = rows[5][2]["mb_per_s"]
    print(f"Encoding {rows[0][2]['bytes'] / 1e6:.1f} MB of Brown documents on one core (best of {a.rounds}):")
    print(f"{'tokenizer':<24} {'implementation':<16} {'tokens':>9} {'MB/s':>7} {'vs tiktoken':>12}")
    for name, impl, res in rows:
        print(f"{name:<24} {impl:<16} {res['tokens']:>9} {res['mb_per_s']:>7.2f} {res['mb_per_s'] / tiktoken:>11.2f}x")
    corpus = os.path.join(tk, f"brown_x{a.copies}.jsonl")
    if not os.path.exists(corpus):
        with open(corpus + ".partial", "w", encoding="utf-8") as f:
            for c in range(a.copies):
                for t in texts:
                    f.write(json.dumps({"id": f"{c}/{os.path.basename(t)}", "text": open(t, encoding="utf-8").read()}) + "\n")
        os.replace(corpus + ".partial", corpus)
    prepare = []
    for np_ in (1, 2):
        out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np_),
                              os.path.join(a.build, "bin", "meshtrain"), "data", "prepare", "--input", corpus,
                              "--output", os.path.join(tk, f"bench_np{np_}.h5"),
                              "--hf-assets-path", os.path.join(ref, "llama3")],
                             check=True, capture_output=True, text=True).stdout
        m = re.search(r"data prepare: ([\d.]+) MB in ([\d.]+) s on \d+ ranks?: ([\d.]+) MB/s", out)
        prepare.append({"ranks": np_, "mb": float(m.group(1)), "seconds": float(m.group(2)), "mb_per_s": float(m.group(3))})
    print(f"\n`meshtrain data prepare` end to end ({prepare[0]['mb']:.0f} MB of JSON Lines, Llama 3 tokenizer.json; "
          "read + tokenize + collective write):")
    for p in prepare:
        print(f"  {p['ranks']} rank{'s' if p['ranks'] > 1 else ' '}: {p['mb_per_s']:6.2f} MB/s ({p['seconds']:.2f} s), "
              f"{p['mb_per_s'] / prepare[0]['mb_per_s']:.2f}x one rank")
    write_result(a.json, {"rounds": a.rounds,
                          "encode": [{"tokenizer": n, "implementation": i, **res} for n, i, res in rows],
                          "prepare": prepare})
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
