#!/usr/bin/env python3
"""ctest tensorboard_events_decode: decodes what build/tests/write_tfevents wrote with
validation/read_tfevents.py (python3-protobuf, python3-crc32c) and checks the scalars, the
--compare-metrics CLI on a matching and on wrong metrics.jsonl files, corrupt and truncated event
files, and that the reader's schema agrees with src/metrics/tensorboard_event.proto as protoc
compiles it.

    check_tfevents.py DIR SOURCE_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

out_dir, source_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(source_dir, "validation"))
import read_tfevents  # noqa: E402

READER = os.path.join(source_dir, "validation", "read_tfevents.py")
tb = os.path.join(out_dir, "tb")
jsonl = os.path.join(out_dir, "metrics.jsonl")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def cli(*args):
    p = subprocess.run([sys.executable, READER, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


# The values write_tfevents.cpp logs, rounded to float32 as simple_value holds them.
def f32(x):
    return float(np.float32(x))


def expected(step):
    return {"loss": 10.0 / (1.0 + 0.37 * step) + 1e-9 * step,
            "grad_norm": math.nan if step == 2 else 1.2345678901234 * step,
            "lr": 3e-4 * step / 7.0}


files = sorted(f for f in os.listdir(tb) if "tfevents" in f)
check(len(files) == 2, f"two event files (first run + resumed run): {files}")
# The writer encodes Event / Summary by hand: every record must be exactly what protobuf itself
# serializes for the message it decodes to (canonical field order, proto3 defaults omitted).
records = [data for f in files for data in read_tfevents.read_records(os.path.join(tb, f))]
canonical = True
for data in records:
    ev = read_tfevents.Event()
    ev.ParseFromString(data)
    canonical &= ev.SerializeToString() == data
check(len(records) > 2 and canonical, f"all {len(records)} records re-serialize to the same bytes with python3-protobuf")
scalars = read_tfevents.read_scalars(tb)
check(sorted(scalars) == ["grad_norm", "loss", "lr"], f"tags {sorted(scalars)}")
steps = [1, 2, 3, 3, 4, 5]
for tag, series in scalars.items():
    check([s for s, _ in series] == steps, f"{tag}: steps {[s for s, _ in series]} in file order")
    exact = all((math.isnan(v) and math.isnan(expected(s)[tag])) or v == f32(expected(s)[tag]) for s, v in series)
    check(exact, f"{tag}: every value is the float32 of what was logged")

rc, out = cli(tb, "--compare-metrics", jsonl, "--tags", "loss,grad_norm,lr")
check(rc == 0, f"--compare-metrics on the run's own metrics.jsonl passes: {out.strip()}")
rc, out = cli(tb, "--compare-metrics", jsonl, "--tags", "loss=loss,lr")
check(rc == 0, "TAG=KEY form")
rc, out = cli(os.path.join(tb, files[0]))
check(rc == 0 and sorted(json.loads(out.replace("NaN", "null"))) == ["grad_norm", "loss", "lr"],
      "a single file prints {tag: [[step, value]]}")

with tempfile.TemporaryDirectory() as tmp:
    records = [json.loads(line) for line in open(jsonl)]

    def write_jsonl(name, recs):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        return path

    off = [dict(r) for r in records]
    for r in off:
        if r.get("step") == 4 and "loss" in r:
            r["loss"] *= 1 + 1e-5  # far beyond float32 rounding (6e-8)
    rc, out = cli(tb, "--compare-metrics", write_jsonl("off.jsonl", off), "--tags", "loss")
    check(rc == 1 and "step 4" in out, f"a loss off by 1e-5 relative is a mismatch (exit {rc}): {out.strip()}")

    missing = [r for r in records if not (r.get("step") == 5 and "loss" in r)]
    rc, out = cli(tb, "--compare-metrics", write_jsonl("missing.jsonl", missing), "--tags", "loss")
    check(rc == 1 and "step 5" in out, f"a step absent from the jsonl is a mismatch (exit {rc})")

    not_nan = [dict(r) for r in records]
    for r in not_nan:
        if r.get("step") == 2 and "grad_norm" in r:
            r["grad_norm"] = 2.0
    rc, out = cli(tb, "--compare-metrics", write_jsonl("nan.jsonl", not_nan), "--tags", "grad_norm")
    check(rc == 1 and "step 2" in out, f"NaN in the events vs a number in the jsonl is a mismatch (exit {rc})")

    rc, out = cli(tb, "--compare-metrics", jsonl, "--tags", "tokens_per_s")
    check(rc == 1 and "tokens_per_s" in out, "a tag in neither file is reported")

    bad = os.path.join(tmp, "corrupt")
    os.makedirs(bad)
    data = bytearray(open(os.path.join(tb, files[0]), "rb").read())
    data[len(data) - 10] ^= 0x01  # inside the last record's data
    open(os.path.join(bad, files[0]), "wb").write(bytes(data))
    rc, out = cli(bad)
    check(rc == 2 and "data CRC mismatch" in out, f"a flipped bit fails the data CRC (exit {rc}): {out.strip()}")
    open(os.path.join(bad, files[0]), "wb").write(bytes(data[:-3]))
    rc, out = cli(bad)
    check(rc == 2 and "truncated" in out, f"a truncated file is reported (exit {rc}): {out.strip()}")

    # The reader's descriptor against the writer's .proto, compiled by protoc.
    protoc = shutil.which("protoc")
    proto_dir = os.path.join(source_dir, "src", "metrics")
    desc_set = os.path.join(tmp, "event.desc")
    subprocess.run([protoc, f"--proto_path={proto_dir}", f"--descriptor_set_out={desc_set}",
                    os.path.join(proto_dir, "tensorboard_event.proto")], check=True)
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(open(desc_set, "rb").read())

    def fields(msgs, prefix=""):
        out = set()
        for m in msgs:
            name = prefix + m.name
            out |= {(name, f.name, f.number, f.type, f.label) for f in m.field}
            out |= fields(m.nested_type, name + ".")
        return out

    writer_fields = fields(fds.file[0].message_type)
    d = read_tfevents.Event.DESCRIPTOR
    reader_fields = set()
    for m in (d, d.fields_by_name["summary"].message_type, d.fields_by_name["summary"].message_type.nested_types[0]):
        name = m.full_name[len("tensorboard."):]
        reader_fields |= {(name, f.name, f.number, f.type, f.label) for f in m.fields}
    check(fds.file[0].package == "tensorboard" and writer_fields == reader_fields,
          f"reader schema == writer .proto ({len(writer_fields)} fields)")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
