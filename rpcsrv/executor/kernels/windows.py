"""Shared geometry for sliding-window ops (conv, pooling): ONNX padding rules and strided views.

Everything works on N-d spatial inputs laid out (N, C, D1, ..., Dk).  The window view is a strided
view (``as_strided``) that already applies ``strides``/``dilations``; no data is copied until a
kernel reduces or multiplies it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

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


def pad_spatial(x: np.ndarray, begin, end, value, slack: int = 0) -> np.ndarray:
    """``x`` padded on its trailing spatial dims with a constant (no copy when nothing to pad).

    The result is a fresh C-contiguous buffer: ``x`` is copied into its interior and only the
    border (and ``slack``) is filled with ``value`` (``np.pad`` costs ~20 us of Python per call,
    more than the copy for most conv inputs; filling the whole buffer first costs another pass).
    ``slack`` > 0 always copies and leaves that many extra ``value`` elements after the padded
    tensor in the same memory (``result.base``), for readers that run past its end (im2col).
    """
    if not any(begin) and not any(end) and not slack:
        return x
    lead = x.ndim - len(begin)
    shape = x.shape[:lead] + tuple(n + b + e for n, b, e in zip(x.shape[lead:], begin, end))
    size = math.prod(shape)
    flat = np.empty(size + slack, x.dtype)
    flat[size:] = value
    xp = flat[:size].reshape(shape)
    inner = tuple(slice(b, b + n) for b, n in zip(begin, x.shape[lead:]))
    xp[(slice(None),) * lead + inner] = x
    for i, (b, e) in enumerate(zip(begin, end)):  # the border slabs, dim by dim
        before = (slice(None),) * lead + inner[:i]
        if b:
            xp[before + (slice(0, b),)] = value
        if e:
            xp[before + (slice(b + x.shape[lead + i], None),)] = value
    return xp


def windows(xp: np.ndarray, kernel, strides, dilations, out_sizes, taps_first: bool = False) -> np.ndarray:
    """Read-only view of shape (..., O1..Ok, K1..Kk) over the last k axes of a padded input.

    ``taps_first`` gives (..., K1..Kk, O1..Ok) instead, the im2col order.  The view is built from
    strides directly (``sliding_window_view`` plus slicing costs several microseconds per call);
    ``resolve_pads`` guarantees every window lies inside ``xp``.
    """
    k = len(kernel)
    lead, st = xp.shape[:xp.ndim - k], xp.strides
    outs = tuple(int(o) for o in out_sizes)
    o_st = tuple(s * q for s, q in zip(strides, st[xp.ndim - k:]))
    k_st = tuple(d * q for d, q in zip(dilations, st[xp.ndim - k:]))
    if taps_first:
        shape, strides_ = lead + tuple(kernel) + outs, st[:xp.ndim - k] + k_st + o_st
    else:
        shape, strides_ = lead + outs + tuple(kernel), st[:xp.ndim - k] + o_st + k_st
    return strided_view(xp, shape, strides_)


def strided_view(base: np.ndarray, shape, strides) -> np.ndarray:
    """A read-only view of ``base``'s memory with the given shape and byte strides.

    For a C-contiguous ``base`` the ndarray constructor is used (under a microsecond, against
    ~3 us for ``as_strided``); the caller guarantees the view stays inside ``base``.
    """
    if base.flags.c_contiguous and base.size:
        view = np.ndarray(tuple(shape), base.dtype, base, 0, tuple(strides))
    else:
        view = as_strided(base, tuple(shape), tuple(strides))
    view.flags.writeable = False
    return view


def dense_stride1_2d(x: np.ndarray, strides, dilations, group: int) -> bool:
    """A float32 2-D conv with one group, stride 1 and no dilation: the layers the fast conv paths
    (``taps``, ``winograd``) may take, before each checks its own shape conditions."""
    return (x.ndim == 4 and x.dtype == np.float32 and group == 1 and list(strides) == [1, 1]
            and list(dilations) == [1, 1])
