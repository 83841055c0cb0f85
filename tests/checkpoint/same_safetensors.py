#!/usr/bin/env python3
"""Exits 0 when two .safetensors files hold the same tensors (names, dtypes, shapes, offsets and
bytes); their __metadata__ (source file name) may differ.

usage: same_safetensors.py A.safetensors B.safetensors
"""
import json
import sys


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return header, raw[8 + n:]


def main():
    (ha, da), (hb, db) = read(sys.argv[1]), read(sys.argv[2])
    if ha != hb:
        sys.exit(f"FAIL: tensor tables differ ({len(ha)} vs {len(hb)} tensors)")
    if da != db:
        sys.exit("FAIL: tensor bytes differ")
    print(f"ok: {len(ha)} tensors, {len(da)} bytes identical")


if __name__ == "__main__":
    main()
