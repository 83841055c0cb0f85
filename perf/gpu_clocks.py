#!/usr/bin/env python3
"""perf/gpu_clocks: GPU 0's SM clock, power and clock-event reasons while a benchmark runs.

A training step's kernels measured one by one under ncu (clocks left alone, an otherwise idle
GPU between kernels) can add up to less than the step's wall time for two reasons: the GPU
waits for the host, or the GPU runs slower under sustained load (power capping, thermal
slowdown). This sampler tells the second from the first: `nvidia-smi -lms` samples utilization,
SM clock, power and the active clock-event reasons every `interval_ms` while the benchmark's
process runs; the summary keeps only the busy samples (utilization >= busy_pct), so start-up,
compilation and the idle time between runs do not count.

    with GpuClockSampler() as clocks:
        run_the_benchmark()
    result["gpu_clocks"] = clocks.summary()   # None when nvidia-smi is missing or failed

The reason bits are NVML's clocksEventReasons (nvmlClocksEventReasons / the older
nvmlClocksThrottleReasons of the NVML API reference).
"""
import os
import shutil
import statistics
import subprocess
import tempfile

# NVML clock-event reason bits (nvml.h: nvmlClocksEventReason*).
REASON_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
FIELDS = ["utilization.gpu", "clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu"]
# Newer drivers name the reasons clocks_event_reasons, older ones clocks_throttle_reasons.
REASON_FIELDS = ["clocks_event_reasons.active", "clocks_throttle_reasons.active"]


def decode_reasons(mask):
    """Names of the reason bits set in `mask` (an int), in bit order; unknown bits as hex."""
    names = [name for bit, name in sorted(REASON_BITS.items()) if mask & bit]
    unknown = mask & ~sum(REASON_BITS)
    return names + ([hex(unknown)] if unknown else [])


def parse_float(text):
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def summarize(lines, fields, busy_pct=90.0):
    """Summary of `nvidia-smi --format=csv,noheader,nounits` lines of `fields` (the reason field,
    if any, last): sample counts, then over the busy samples the SM clock (median, minimum, the
    GPU's maximum), power (median) and temperature (maximum) and the union of the active reasons.
    Returns None without busy samples."""
    busy, total = [], 0
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        total += 1
        rec = dict(zip(fields, parts))
        util = parse_float(rec["utilization.gpu"])
        if util is not None and util >= busy_pct:
            busy.append(rec)
    if not busy:
        return {"samples": total, "busy_samples": 0} if total else None
    def values(field):
        return [v for v in (parse_float(r[field]) for r in busy) if v is not None]
    sm, power, temp, smax = values("clocks.sm"), values("power.draw"), values("temperature.gpu"), values("clocks.max.sm")
    mask = 0
    reason_field = next((f for f in fields if f in REASON_FIELDS), None)
    if reason_field:
        for r in busy:
            try:
                mask |= int(r[reason_field], 16)
            except ValueError:
                pass
    return {
        "samples": total, "busy_samples": len(busy), "busy_pct": busy_pct,
        "sm_clock_mhz_median": statistics.median(sm) if sm else None,
        "sm_clock_mhz_min": min(sm) if sm else None,
        "sm_clock_max_mhz": max(smax) if smax else None,
        "power_w_median": statistics.median(power) if power else None,
        "temperature_c_max": max(temp) if temp else None,
        "clock_event_reasons": decode_reasons(mask) if reason_field else None,
    }


class GpuClockSampler:
    """Samples GPU `gpu` with nvidia-smi every `interval_ms` between __enter__ and __exit__.
    Does nothing (summary() is None) without nvidia-smi or when `enabled` is false; never raises
    for nvidia-smi's own failures (a benchmark must not fail for want of a diagnostic)."""

    def __init__(self, enabled=True, interval_ms=100, busy_pct=90.0, gpu=0):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.interval_ms, self.busy_pct, self.gpu = interval_ms, busy_pct, gpu
        self.fields, self.proc, self.path, self._summary = None, None, None, None

    def _query(self, fields):
        return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", str(self.gpu)]

    def __enter__(self):
        if not self.enabled:
            return self
        for reason in REASON_FIELDS + [None]:  # the first query the driver accepts
            fields = FIELDS + ([reason] if reason else [])
            try:
                ok = subprocess.run(self._query(fields), capture_output=True, text=True, timeout=20).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                self.fields = fields
                break
        if not self.fields:
            return self
        fd, self.path = tempfile.mkstemp(prefix="gpu_clocks_", suffix=".csv")
        with os.fdopen(fd, "w") as out:
            self.proc = subprocess.Popen(self._query(self.fields) + [f"--loop-ms={self.interval_ms}"], stdout=out,
                                         stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            with open(self.path) as f:
                self._summary = summarize(f.read().splitlines(), self.fields, self.busy_pct)
            os.remove(self.path)
            self.proc = None
        return False

    def summary(self):
        return self._summary


def describe(s):
    """One line for a summary (or "not sampled")."""
    if not s:
        return "not sampled"
    if not s.get("busy_samples"):
        return f"no busy sample of {s['samples']}"
    def num(key, unit):
        v = s.get(key)
        return f"{v:.0f}{unit}" if v is not None else "?"
    reasons = s.get("clock_event_reasons")
    return (f"SM {num('sm_clock_mhz_median', ' MHz')} median, {num('sm_clock_mhz_min', '')} min "
            f"(max {num('sm_clock_max_mhz', '')}), {num('power_w_median', ' W')}, {num('temperature_c_max', ' C')} max, "
            f"{s['busy_samples']} busy samples; reasons: "
            f"{', '.join(reasons) if reasons else ('none' if reasons is not None else 'not reported')}")
