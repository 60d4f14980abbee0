"""Column matrices for convolution as one BLAS product (im2col), in as few copies as possible.

``columns`` turns an (N, C, D1..Dk) input into (N, C*K [+1], Q): row ``c*K + tap`` holds the
input values that kernel tap meets at each of Q output positions, so ``W.reshape(M, C*K) @ cols``
is the convolution.  Three layouts, chosen by geometry (each measured against the others on the
ResNet layers, 1 thread):

* **1x1, stride 1, no padding**: the input itself, reshaped (no copy at all).
* **stride 1, "flat" columns**: the padded input is one zero-filled buffer; with its spatial dims
  flattened, tap ``t`` of output ``q`` sits at ``q + offset(t)``, so each column row is a
  contiguous run of the buffer and the copy moves long rows (2-3x faster than gathering windows).
  Q then covers the padded row width (O1 x P2 x ... x Pk): the extra positions are computed and
  cropped, so this layout is used only when the extra GEMM work costs less than the copy it saves
  (``FLAT_BUDGET``): the copy saves about one inner loop (~4 ns) per output row and column-matrix
  row, the extra positions cost 2*M flops each per column-matrix row (~10 ps a flop at ~100
  GFLOP/s), so flat columns pay when M * extra positions <= ~200 * output rows.  Measured, 3x3
  pad 1: M=32 at 28x28 and M=64 at 56x56 or 14x14 gain (5-10%), M=128 at 28x28 and M=256 at 14x14
  lose (3-6%).
* **any other geometry**: the padded input's strided window view, copied once.

With ``ones_row`` an extra row of ones is appended, so a bias can ride along in the GEMM as an
extra weight column (cheaper than a separate pass when C*K is small against Q, as in a stem conv).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..windows import pad_spatial, strided_view

#: largest (computed positions / output positions) for which stride-1 convs use flat columns ...
FLAT_MAX_EXTRA = 1.2
#: ... and out channels * extra positions per output row must stay within this
FLAT_BUDGET = 200
#: gather through an index table when output rows are at most this long ...
GATHER_MAX_ROW = 8
#: ... and the column matrix of one image has at most this many elements (int32 table <= 1 MiB;
#: with the cache below at most 64 MiB of tables, ResNet-18's are 0.1-0.9 MiB)
GATHER_MAX_SIZE = 1 << 18


def columns(x: np.ndarray, kernel, strides, dilations, begin, end, out, ones_row: bool = False,
            out_channels: int = 1) -> tuple[np.ndarray, tuple[int, ...], bool]:
    """(cols of shape (N, C*K [+1], Q), grid, whether the ones row is there).

    ``grid`` is the spatial shape Q reshapes to: ``out``, except for flat columns, where it is
    (O1, P2, ..., Pk) and the caller crops ``[:O2, ..., :Ok]`` after the product.  A 1x1 conv
    that needs no copy gets no ones row (a bias add is cheaper than copying the input).
    ``out_channels`` (the GEMM's M) weighs the extra work of flat columns.
    """
    n, c = x.shape[:2]
    out = tuple(int(o) for o in out)
    padded = any(begin) or any(end)
    unit = all(s == 1 for s in strides)
    if unit and not padded and all(kk == 1 for kk in kernel):
        return x.reshape(n, c, math.prod(out)), out, False
    if unit and len(out) > 1:
        sizes = [s + b + e for s, b, e in zip(x.shape[2:], begin, end)]
        grid = (out[0],) + tuple(sizes[1:])
        extra, out_rows = math.prod(grid) - math.prod(out), math.prod(out[:-1])
        if math.prod(grid) <= FLAT_MAX_EXTRA * math.prod(out) and out_channels * extra <= FLAT_BUDGET * out_rows:
            return _flat_columns(x, kernel, dilations, begin, end, sizes, grid, ones_row), grid, ones_row
    rows, q = c * math.prod(kernel), math.prod(out)
    if out and out[-1] <= GATHER_MAX_ROW and (rows + ones_row) * q <= GATHER_MAX_SIZE:
        return _gathered_columns(x, kernel, strides, dilations, begin, out, ones_row), out, ones_row
    xp = np.ascontiguousarray(pad_spatial(x, begin, end, 0))
    st = xp.strides[2:]
    view = strided_view(xp, (n, c) + tuple(kernel) + out, xp.strides[:2]
                        + tuple(d * q for d, q in zip(dilations, st))
                        + tuple(s * q for s, q in zip(strides, st)))
    return _copy_rows(view, n, rows, q, ones_row), out, ones_row


def _flat_columns(x, kernel, dilations, begin, end, sizes, grid, ones_row):
    """Stride-1 columns read as contiguous runs of the flattened padded planes."""
    n, c = x.shape[:2]
    plane = math.prod(sizes)
    pitch = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]  # flat step of each spatial dim
    q = math.prod(grid)
    reach = sum((kk - 1) * d * p for kk, d, p in zip(kernel, dilations, pitch))
    slack = max(0, q + reach - plane)  # the last plane's extra positions read past its end
    xp = pad_spatial(x, begin, end, 0, slack=slack)
    base = xp.base if slack else xp
    item = base.itemsize
    view = strided_view(base, (n, c) + tuple(kernel) + (q,),
                        (c * plane * item, plane * item) + tuple(d * p * item for d, p in zip(dilations, pitch))
                        + (item,))
    return _copy_rows(view, n, c * math.prod(kernel), q, ones_row)


def _copy_rows(view, n, rows, q, ones_row):
    """``view`` (N, C, taps..., positions...) copied into a fresh (N, rows [+1], Q) matrix."""
    cols = np.empty((n, rows + ones_row, q), view.dtype)
    np.copyto(cols[:, :rows].reshape(view.shape), view)
    if ones_row:
        cols[:, rows] = 1
    return cols


def _gathered_columns(x, kernel, strides, dilations, begin, out, ones_row):
    """Columns by one ``take`` through a cached index table (small outputs, see ``_gather_index``).

    The source is each image flattened, followed by a 0 (what padding reads) and a 1 (the ones
    row), so no padded copy is made.
    """
    n, c = x.shape[:2]
    size = x[0].size
    src = np.empty((n, size + 2), x.dtype)
    src[:, :size] = x.reshape(n, size)
    src[:, size], src[:, size + 1] = 0, 1
    index = _gather_index(c, tuple(x.shape[2:]), tuple(kernel), tuple(strides), tuple(dilations),
                          tuple(begin), tuple(out), ones_row)
    return np.take(src, index, axis=1).reshape(n, index.size // math.prod(out), math.prod(out))


@functools.lru_cache(maxsize=64)
def _gather_index(c, sizes, kernel, strides, dilations, begin, out, ones_row) -> np.ndarray:
    """Flat source index of every column element (C, K..., O... order), for ``_gathered_columns``.

    A gather moves each element independently, where copying a window view runs one inner loop
    per output row: for rows of 4-7 elements (late ResNet stages) the gather is ~2x faster.  The
    table depends on the geometry only, so it is computed once per conv shape (read-only).
    """
    k = len(sizes)
    pitch = [math.prod(sizes[i + 1:]) for i in range(k)]
    plane = math.prod(sizes)
    flat = np.zeros((1,) * (2 * k), np.int64)
    inside = np.ones((1,) * (2 * k), bool)
    for i in range(k):  # position along dim i = o*stride + t*dilation - pad_begin
        t = np.arange(kernel[i]).reshape((1,) * i + (-1,) + (1,) * (2 * k - i - 1))
        o = np.arange(out[i]).reshape((1,) * (k + i) + (-1,) + (1,) * (k - i - 1))
        pos = o * strides[i] + t * dilations[i] - begin[i]
        inside = inside & (pos >= 0) & (pos < sizes[i])
        flat = flat + pos * pitch[i]
    channel = np.arange(c).reshape((-1,) + (1,) * (2 * k)) * plane
    index = np.where(inside, channel + flat, c * plane).reshape(-1)  # outside: the 0 after the image
    if ones_row:
        index = np.concatenate([index, np.full(math.prod(out), c * plane + 1)])
    index = index.astype(np.int32 if index.size and c * plane + 2 < 2**31 else np.int64)
    index.flags.writeable = False
    return index
