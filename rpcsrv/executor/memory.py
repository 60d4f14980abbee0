"""Allocator tuning for the numpy kernels: keep freed large blocks in the process.

Every kernel returns a fresh result array, and the ExampleJSON runtime drops intermediates after
their last use.  With glibc's defaults, blocks above ``M_MMAP_THRESHOLD`` (128 KiB at start, then
adapted) are ``mmap``-ed and ``munmap``-ed on free, and the top of the heap is trimmed back to the
OS beyond ``M_TRIM_THRESHOLD``.  Either way the next run's arrays land on fresh pages and every
page is faulted in again (4 KiB at a time, zeroed by the kernel): for a conv with a 1.5 MB column
matrix that is most of its time.

:func:`tune_allocator` raises both thresholds so those blocks are recycled from the heap.
Measured on the bench machine (glibc 2.x, 1 thread, median of 200 calls): the first ResNet conv
(1x3x112x112 -> 32 channels, 3x3 stride 2) went from ~450-530 us to ~150-185 us; the rest of the
model gained less (smaller arrays).  Both settings are needed together: with only the mmap
threshold raised the heap top is still trimmed, with only the trim threshold raised the large
blocks are still mmap-ed; either alone measured slower than both.

The cost is memory: up to ``TRIM_THRESHOLD`` bytes of freed heap stay mapped in the process, and
allocations under ``MMAP_THRESHOLD`` come from the heap (fragmentation is possible, as with any
heap block).  On a platform without glibc's ``mallopt`` (macOS, musl, Windows) the call does
nothing.
"""

from __future__ import annotations

import contextvars
import ctypes
import ctypes.util
import threading

#: glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: freed heap kept in the process before the top is returned to the OS
TRIM_THRESHOLD = 256 << 20
#: blocks from this size up are still mmap-ed (32 MiB is glibc's maximum on 64-bit)
MMAP_THRESHOLD = 32 << 20

_lock = threading.Lock()
_state: dict[str, bool] = {}


def _mallopt():
    """glibc's ``mallopt`` as a ctypes function, or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    # musl and others have no mallopt symbol (AttributeError above); glibc's is int(int, int)
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def tune_allocator() -> bool:
    """Set glibc's trim and mmap thresholds once per process; True when they are set.

    Idempotent and thread-safe: later calls return the first call's result without touching the
    allocator again.  False means this platform has no ``mallopt`` (or it refused the values).
    """
    with _lock:
        if "done" not in _state:
            fn = _mallopt()
            ok = fn is not None and bool(fn(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) \
                and bool(fn(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
            _state["done"] = ok
        return _state["done"]


# Accounting hook: the server sets ALLOCATION_HOOK around a session's calls; executors
# report storage they are about to allocate, so an over-budget graph is refused before allocation.
ALLOCATION_HOOK: contextvars.ContextVar = contextvars.ContextVar("rpcsrv_allocation_hook", default=None)


def before_allocation(owner: object, nbytes: int, what: str) -> None:
    """Report ``nbytes`` that ``owner`` is about to allocate (raises when over budget)."""
    hook = ALLOCATION_HOOK.get()
    if hook is not None:
        hook(owner, nbytes, what)
