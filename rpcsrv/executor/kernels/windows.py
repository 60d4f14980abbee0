"""Shared geometry for sliding-window ops (conv, pooling): ONNX padding rules and strided views.

Everything works on N-d spatial inputs laid out (N, C, D1, ..., Dk).  The window view is built with
``numpy.lib.stride_tricks.sliding_window_view`` and then strided by ``strides``/``dilations``; no data
is copied until a kernel reduces or multiplies it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .registry import bad


def spatial_attr(values, k: int, default: int, name: str, op: str) -> list[int]:
    """An ints attribute with one entry per spatial dim (default when absent)."""
    if values is None:
        return [default] * k
    values = [int(v) for v in values]
    if len(values) != k:
        raise bad(op, f"{name} needs {k} values, got {values}")
    if any(v < 1 for v in values):
        raise bad(op, f"{name} must be positive, got {values}")
    return values


def resolve_pads(op: str, in_sizes, kernel, strides, dilations, pads, auto_pad: str,
                 ceil_mode: int = 0) -> tuple[list[int], list[int], list[int]]:
    """(pads_begin, pads_end, output_sizes) for ONNX's pads/auto_pad/ceil_mode rules.

    ``pads_end`` may exceed the explicit pads when ceil_mode needs a partial last window; callers
    that average must not count that extra region (see ``extra_end``).
    """
    k = len(in_sizes)
    ext = [(kk - 1) * d + 1 for kk, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(n / s) for n, s in zip(in_sizes, strides)]
        total = [max(0, (o - 1) * s + e - n) for o, s, e, n in zip(out, strides, ext, in_sizes)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        return begin, end, out
    if auto_pad == "VALID":
        begin, end = [0] * k, [0] * k
    elif auto_pad in ("NOTSET", "", None):
        p = [0] * (2 * k) if pads is None else [int(v) for v in pads]
        if len(p) != 2 * k or any(v < 0 for v in p):
            raise bad(op, f"pads needs {2 * k} non-negative values, got {pads}")
        begin, end = p[:k], p[k:]
    else:
        raise bad(op, f"unknown auto_pad {auto_pad!r}")
    out = []
    for n, b, e, x, s in zip(in_sizes, begin, end, ext, strides):
        span = n + b + e - x
        if span < 0:
            raise bad(op, f"window of extent {x} larger than padded input {n + b + e}")
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= n + b:  # a window starting inside the end padding is dropped
            o -= 1
        out.append(o)
    end = [max(e, (o - 1) * s + x - n - b) for o, s, x, n, b, e in zip(out, strides, ext, in_sizes, begin, end)]
    return begin, end, out


def pad_spatial(x: np.ndarray, begin, end, value) -> np.ndarray:
    """``x`` padded on its trailing spatial dims with a constant (no copy when nothing to pad)."""
    if not any(begin) and not any(end):
        return x
    widths = [(0, 0)] * (x.ndim - len(begin)) + list(zip(begin, end))
    return np.pad(x, widths, constant_values=value)


def windows(xp: np.ndarray, kernel, strides, dilations, out_sizes) -> np.ndarray:
    """View of shape (..., O1..Ok, K1..Kk) over the last k axes of a padded input."""
    k = len(kernel)
    axes = tuple(range(xp.ndim - k, xp.ndim))
    ext = [(kk - 1) * d + 1 for kk, d in zip(kernel, dilations)]
    v = sliding_window_view(xp, ext, axis=axes)
    lead = (slice(None),) * (xp.ndim - k)
    outs = tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out_sizes, strides))
    wins = tuple(slice(None, None, d) for d in dilations)
    return v[lead + outs + wins]
