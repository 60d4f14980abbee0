"""What a tuner asks of a board besides calls: TVM's time evaluator and its helpers.

* :func:`time_evaluator` is TVM's ``WrapTimeEvaluator`` (``src/runtime/timer.cc`` at HEAD): one
  warm-up call, then ``repeat`` measurements of ``number`` calls each, ``number`` grown by the
  golden ratio until one measurement lasts ``min_repeat_ms``, ``f_preproc`` before each
  measurement, ``cache_flush_bytes`` copied between two scratch arrays before each timing, a
  cooldown sleep every ``repeats_to_cooldown`` measurements; the result is the seconds per call of
  each measurement as little-endian float64 bytes.
* ``cache_flush_cpu_non_first_arg`` (the f_preproc MetaSchedule uses) evicts every array argument
  but the first from the CPU caches (``clflush``/``dc civac`` in the shim, else by streaming over
  a buffer larger than the last-level cache).
* ``random_fill_for_measure`` (``tvm.contrib.random.random_fill_for_measure``) fills a tensor with
  uniform values in [1, 10) written as floats of the element width, as TVM's random engine does
  (so int tensors get float bit patterns, like TVM's).
"""

from __future__ import annotations

import functools
import struct
import time
from typing import Any, Callable, Optional

import numpy as np

from ..executor import compute

def cache_flush_cpu_non_first_arg(*args: Any) -> None:
    arrays = [a for a in args[1:] if isinstance(a, np.ndarray) and a.size]
    from .shim import ShimUnavailable, load_shim

    try:
        flush = load_shim().rpcsrv_cache_flush
    except ShimUnavailable:  # no shim on this board: stream over a scratch buffer instead
        flush = None
    if flush is not None:
        for a in arrays:
            flush(a.ctypes.data, a.nbytes)
        return
    _evict_buffer()[:] += 1.0  # touch 64 MiB: whatever the arrays had cached is gone


@functools.lru_cache(maxsize=1)
def _evict_buffer() -> np.ndarray:
    """The scratch streamed over when the shim cannot flush lines (made once)."""
    return np.ones(64 << 20 >> 3, np.float64)


def random_fill_for_measure(arr: Any) -> None:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"random_fill_for_measure expects a tensor, got {type(arr).__name__}")
    if not arr.flags.writeable:
        raise ValueError("random_fill_for_measure: the tensor is read-only")
    values = np.random.default_rng().uniform(1.0, 10.0, arr.size)
    width = arr.dtype.itemsize
    as_float = {1: np.uint8, 2: np.float16, 4: np.float32, 8: np.float64}.get(width)
    if as_float is None or arr.dtype.kind not in "iufb":
        raise ValueError(f"random_fill_for_measure: dtype {arr.dtype} is not supported")
    flat = arr.reshape(-1) if arr.flags.c_contiguous else None
    filled = values.astype(as_float).view(arr.dtype) if width > 1 else values.astype(np.uint8).view(arr.dtype)
    if flat is not None:
        flat[:] = filled
    else:
        arr[...] = filled.reshape(arr.shape)


def _bound(fn: Callable[..., Any], args: tuple) -> Callable[[], Any]:
    """``fn`` with ``args``: native functions convert their arguments once (``NativeFunction.bind``)."""
    bind = getattr(fn, "bind", None)
    if bind is not None and all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in args):
        return bind(*args)
    return lambda: fn(*args)


#: f_preproc names a board resolves (TVM registers them as global functions)
PREPROC: dict[str, Callable[..., Any]] = {"cache_flush_cpu_non_first_arg": cache_flush_cpu_non_first_arg}


def time_evaluator(fn: Callable[..., Any], number: int, repeat: int, min_repeat_ms: int,
                   limit_zero_time_iterations: int = 100, cooldown_interval_ms: int = 0,
                   repeats_to_cooldown: int = 1, cache_flush_bytes: int = 0,
                   f_preproc: Optional[Callable[..., Any]] = None) -> Callable[..., bytes]:
    """The timing function for ``fn`` (see the module doc); ValueError for bad parameters."""
    if number < 1 or repeat < 1:
        raise ValueError("time_evaluator needs number >= 1 and repeat >= 1")
    if cache_flush_bytes < 0 or cache_flush_bytes > 1 << 30:
        raise ValueError(f"cache_flush_bytes must be in [0, 1 GiB], got {cache_flush_bytes}")

    def evaluate(*args: Any) -> bytes:
        with compute.job():  # the whole measurement is one job: its runs take no slot each
            return _evaluate(args)

    def _evaluate(args: tuple) -> bytes:
        call = _bound(fn, args)
        call()  # warm-up, as TVM does
        scratch = [np.empty(cache_flush_bytes // 4, np.int32) for _ in range(2)] if cache_flush_bytes > 0 else None
        out = []
        n = number
        for i in range(repeat):
            if f_preproc is not None:
                f_preproc(*args)
            duration_ms, zero_times = 0.0, 0
            while True:
                if duration_ms > 0.0:
                    n = int(max(min_repeat_ms / (duration_ms / n) + 1, n * 1.618))
                if scratch is not None:
                    np.copyto(scratch[0], scratch[1])
                start = time.perf_counter_ns()
                for _ in range(n):
                    call()
                elapsed = time.perf_counter_ns() - start
                zero_times += elapsed == 0
                duration_ms = elapsed / 1e6
                if duration_ms >= min_repeat_ms or zero_times >= limit_zero_time_iterations:
                    break
            out.append(duration_ms / 1e3 / n)
            if cooldown_interval_ms > 0 and i % max(repeats_to_cooldown, 1) == 0:
                time.sleep(cooldown_interval_ms / 1e3)
        return struct.pack(f"<{len(out)}d", *out)

    return evaluate
