#!/usr/bin/env python3
"""Reads TensorBoard event files without TensorBoard or TensorFlow, and optionally checks their
scalars against meshtrain's metrics.jsonl.

    read_tfevents.py PATH                      # print {tag: [[step, value], ...]} as JSON
    read_tfevents.py PATH --compare-metrics metrics.jsonl --tags loss,grad_norm,lr
    read_tfevents.py PATH --compare-metrics metrics.jsonl --tags loss_metrics/global_avg_loss=loss

PATH is an event file or a folder; a folder's files whose names contain "tfevents" are read in
name order (the names start with the creation time, so a resumed run's file comes after the
first run's). Every record's framing is checked: TFRecord (TensorFlow's
tensorflow/core/lib/io/record_writer.h) = uint64 length (little-endian), uint32 masked CRC-32C of
those 8 bytes, the data, uint32 masked CRC-32C of the data, with mask(c) = ((c >> 15) | (c << 17))
+ 0xa282ead8 mod 2^32 (tensorflow/core/lib/hash/crc32c.h). The data is a tensorboard.Event
protocol buffer, decoded with google.protobuf from a descriptor built below with TensorBoard's
published field numbers (tensorflow/tensorboard: tensorboard/compat/proto/event.proto and
summary.proto; meshtrain's writer uses the same numbers in src/metrics/tensorboard_event.proto).

--compare-metrics: each TAG[=KEY] of --tags (KEY defaults to TAG) is compared step by step with
the jsonl records that have a "step" and that KEY (validation and summary lines without it are
skipped): the steps must be the same in both, and every value at a step must match a value of the
other side at that step within float32 rounding (TensorBoard's simple_value is a float32), a
jsonl null matching a NaN. A step logged twice (a resumed run re-running steps) must agree as a set.

Exit status: 0 success; 1 a scalar mismatch, a missing tag or step; 2 an unreadable or corrupt
file (bad CRC, truncated record, undecodable event) or bad arguments.
Uses Debian's python3-protobuf and python3-crc32c.
"""
import argparse
import json
import math
import os
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

MASK_DELTA = 0xA282EAD8
# float32 has a 24-bit significand: rounding a double to it moves it by at most 2^-24 relative.
FLOAT32_REL_TOL = 2.0 ** -23


class EventFileError(Exception):
    """A file that is not a well-formed TFRecord stream of Event protos."""


def masked_crc32c(data):
    c = crc32c.crc32c(data) & 0xFFFFFFFF
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF


def _event_class():
    """The tensorboard.Event message class, from a descriptor with TensorBoard's field numbers."""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="meshtrain_read_tfevents.proto", package="tensorboard",
                                             syntax="proto3")
    summary = fdp.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorboard.Summary.Value")
    event = fdp.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorboard.Summary", oneof_index=0)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("tensorboard.Event")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22 (Python 4.x numbering)
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)  # Debian 12's 3.21


Event = _event_class()


def read_records(path):
    """Yields the data of every TFRecord in `path`, checking both CRCs. Raises EventFileError."""
    with open(path, "rb") as f:
        buf = f.read()
    pos, n = 0, 0
    while pos < len(buf):
        if len(buf) - pos < 12:
            raise EventFileError(f"{path}: record {n} at byte {pos}: truncated header")
        header = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        if masked_crc32c(header) != header_crc:
            raise EventFileError(f"{path}: record {n} at byte {pos}: length CRC mismatch")
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(buf):
            raise EventFileError(f"{path}: record {n} at byte {pos}: truncated data ({length} bytes announced)")
        data = buf[start:end]
        (data_crc,) = struct.unpack("<I", buf[end:end + 4])
        if masked_crc32c(data) != data_crc:
            raise EventFileError(f"{path}: record {n} at byte {pos}: data CRC mismatch")
        yield data
        pos, n = end + 4, n + 1


def event_files(path):
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise EventFileError(f"{path}: no such file or folder")
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if "tfevents" in f)
    if not files:
        raise EventFileError(f"{path}: no event file (a name containing 'tfevents') in this folder")
    return files


def read_scalars(path):
    """{tag: [(step, value), ...]} of every simple_value in the event file(s) at `path`, in file
    order. Each file must start with a file_version "brain.Event:..." record. Raises EventFileError."""
    scalars = {}
    for file in event_files(path):
        for i, data in enumerate(read_records(file)):
            ev = Event()
            try:
                ev.ParseFromString(data)
            except Exception as e:  # google.protobuf.message.DecodeError
                raise EventFileError(f"{file}: record {i}: not an Event protocol buffer ({e})")
            if i == 0:
                if not ev.file_version.startswith("brain.Event:"):
                    raise EventFileError(f"{file}: first record has file_version '{ev.file_version}', "
                                         "expected 'brain.Event:2'")
                continue
            for v in ev.summary.value:
                if v.WhichOneof("value") == "simple_value":
                    scalars.setdefault(v.tag, []).append((int(ev.step), float(v.simple_value)))
    return scalars


def _matches(tb, ref):
    """tb (a float32 value) against ref (a jsonl number or None)."""
    if ref is None or (isinstance(ref, float) and math.isnan(ref)):
        return math.isnan(tb)
    if math.isinf(ref) or math.isinf(tb):
        return tb == ref
    return abs(tb - ref) <= FLOAT32_REL_TOL * abs(ref) + 1e-38


def compare(scalars, metrics_path, tags):
    """Mismatch messages (empty: all agree) between `scalars` and the jsonl at `metrics_path`
    for each (tag, key) of `tags`."""
    records = []
    with open(metrics_path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise EventFileError(f"{metrics_path}:{lineno}: not JSON ({e})")
    errors = []
    for tag, key in tags:
        ref = {}
        for r in records:
            if "step" in r and key in r and "event" not in r:
                ref.setdefault(int(r["step"]), []).append(r[key])
        got = {}
        for step, value in scalars.get(tag, []):
            got.setdefault(step, []).append(value)
        if not ref:
            errors.append(f"{metrics_path}: no record has key '{key}'")
            continue
        if tag not in scalars:
            errors.append(f"event files: no scalar with tag '{tag}'")
            continue
        for step in sorted(set(ref) | set(got)):
            if step not in got:
                errors.append(f"tag '{tag}' step {step}: in {metrics_path} ({key} = {ref[step]}) but not in the event files")
            elif step not in ref:
                errors.append(f"tag '{tag}' step {step}: in the event files ({got[step]}) but not in {metrics_path}")
            else:
                unmatched = [v for v in got[step] if not any(_matches(v, x) for x in ref[step])]
                unmatched += [x for x in ref[step] if not any(_matches(v, x) for v in got[step])]
                if unmatched:
                    errors.append(f"tag '{tag}' step {step}: event files {got[step]} != {metrics_path} "
                                  f"{key} = {ref[step]} (float32 rounding allowed)")
    return errors


def parse_tags(text):
    tags = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        tag, _, key = item.partition("=")
        tags.append((tag, key or tag))
    return tags


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="event file, or folder of event files")
    ap.add_argument("--compare-metrics", metavar="JSONL", help="metrics.jsonl to compare the scalars with")
    ap.add_argument("--tags", default="", help="comma-separated TAG[=KEY] to compare (needs --compare-metrics)")
    args = ap.parse_args(argv)
    tags = parse_tags(args.tags)
    if args.compare_metrics and not tags:
        print("read_tfevents.py: --compare-metrics needs --tags TAG[=KEY],...", file=sys.stderr)
        return 2
    try:
        scalars = read_scalars(args.path)
        if not args.compare_metrics:
            json.dump({t: [[s, v] for s, v in sv] for t, sv in scalars.items()}, sys.stdout, indent=1)
            print()
            return 0
        errors = compare(scalars, args.compare_metrics, tags)
    except (EventFileError, OSError) as e:
        print(f"read_tfevents.py: {e}", file=sys.stderr)
        return 2
    for e in errors:
        print(f"read_tfevents.py: {e}", file=sys.stderr)
    if errors:
        return 1
    n = sum(len(scalars[t]) for t, _ in tags)
    print(f"read_tfevents.py: {n} scalars of {len(tags)} tags match {args.compare_metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
