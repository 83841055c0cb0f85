"""Free page reporting: a virtual machine's freed memory handed back to its hypervisor.

Linux's page_reporting (used by virtio-balloon's VIRTIO_BALLOON_F_REPORTING) tells the host which
guest pages are free, in blocks of 2^page_reporting_order pages; the host drops their backing, so
the guest's next touch of such a page faults in the host and costs far more than an ordinary page
fault. On the VM this project's benchmarks run on, touching never-used or reported memory ran at
about 0.3 GB/s (3.2-3.6 s per GiB) against 2.1 GB/s (0.47 s per GiB) for memory the guest had
touched and not yet reported.

That makes a benchmark of a process that needs fresh memory (a checkpoint load fills hundreds of
MB of newly allocated tensors, plus the page cache its buffered reads fill) depend on how much of
the guest's free memory happens to be host-backed at that moment, while dd, reading into one
reused 4 MiB buffer, barely notices. `hold()` stops the reporting for the length of a benchmark
(root only) and touches `warm_bytes` of memory once, so that both sides of a comparison get
host-backed pages; the previous setting is restored on exit, including on SIGTERM and Ctrl-C.
"""
import contextlib
import mmap
import os
import signal
import time

PARAMS = "/sys/module/page_reporting/parameters"


def state():
    """{'order': int, 'reported_kib': int} of the running kernel, or None where the kernel has no
    free page reporting (bare metal, or a VM without it)."""
    try:
        order = int(open(os.path.join(PARAMS, "page_reporting_order")).read())
    except (OSError, ValueError):
        return None
    try:
        reported = int(open(os.path.join(PARAMS, "reported_kib")).read())
    except (OSError, ValueError):
        reported = -1  # some kernels do not count
    return {"order": order, "reported_kib": reported}


def _set_order(value):
    with open(os.path.join(PARAMS, "page_reporting_order"), "w") as f:
        f.write(str(value))


def warm(nbytes):
    """Writes one byte per page of `nbytes` of fresh anonymous memory, then frees it. Returns the
    seconds it took (a measure of how much of it had to be backed by the host)."""
    t0 = time.perf_counter()
    m = mmap.mmap(-1, nbytes)
    page = mmap.PAGESIZE
    m[::page] = bytes(len(range(0, nbytes, page)))
    m.close()
    return time.perf_counter() - t0


@contextlib.contextmanager
def hold(warm_bytes=0):
    """Stops free page reporting inside the `with` block (page_reporting_order set above the
    largest block the kernel allocates, so that no free block qualifies) and restores the value
    found. Yields a dict: {'order_before', 'order_held', 'warm_s'}. Raises PermissionError without
    root and RuntimeError where the kernel has no free page reporting."""
    before = state()
    if before is None:
        raise RuntimeError(f"{PARAMS}: this kernel has no free page reporting; nothing to hold")
    held = None
    for order in (11, 10):  # MAX_PAGE_ORDER + 1 where the kernel accepts it, else the largest block
        try:
            _set_order(order)
            held = order
            break
        except PermissionError as e:
            raise PermissionError(f"{PARAMS}/page_reporting_order: writing it needs root") from e
        except OSError:
            continue  # EINVAL: above this kernel's limit
    if held is None:
        raise RuntimeError(f"{PARAMS}/page_reporting_order: the kernel accepted neither 11 nor 10")
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    for s in previous:
        signal.signal(s, leave)
    try:
        yield {"order_before": before["order"], "order_held": held, "warm_s": warm(warm_bytes) if warm_bytes else 0.0}
    finally:
        _set_order(before["order"])
        for s, h in previous.items():
            signal.signal(s, h)
