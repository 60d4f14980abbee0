"""Pooling: MaxPool, AveragePool, LpPool and the global pools.

Max and average pools reduce with contiguous whole-buffer ufunc passes (``_pool_reduce``: one pass per
kernel tap and spatial dim, separable, no strided tap views; the edge windows that reach into the padding
combine their valid taps only); the common 3x3 pools (stride 2 halving even sizes, stride 1 pad 1) take
shifted passes over whole buffers per dim instead (``_halve``, ``_same3``).  The padding value never wins
a max and adds nothing to a sum; average pooling divides by a per-position count computed once per
geometry: the explicit pads count when ``count_include_pad=1``; the extra end padding that ``ceil_mode``
adds never counts.  MaxPool's indices output and LpPool reduce the strided window view of a padded copy
tap by tap."""

from __future__ import annotations

import functools
import math

import numpy as np

from ..registry import bad, register
from ..windows import pad_spatial, resolve_pads, spatial_attr, windows


def _geometry(op, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    x = np.asarray(x)
    if x.ndim < 3:
        raise bad(op, f"input must be (N, C, spatial...), got shape {x.shape}")
    k = x.ndim - 2
    if kernel_shape is None:
        raise bad(op, "kernel_shape is required")
    kernel = spatial_attr(kernel_shape, k, 1, "kernel_shape", op)
    strides = spatial_attr(strides, k, 1, "strides", op)
    dilations = spatial_attr(dilations, k, 1, "dilations", op)
    begin, end, out = resolve_pads(op, x.shape[2:], kernel, strides, dilations, pads, auto_pad, ceil_mode)
    return x, k, kernel, strides, dilations, begin, end, out


#: a strided non-last dim is reduced at its kept positions only (in rows of the trailing dims) when those rows
#: hold at least this many values; shorter rows: padded, every position in one contiguous pass, stride-th kept
ROW_MIN = 64


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


@register("max_pool")
def max_pool(x, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations=None, kernel_shape=None,
             pads=None, storage_order: int = 0, strides=None, return_indices: int = 0):
    """ONNX MaxPool.  With ``return_indices=1`` (an rpcsrv attribute the compiler sets when the
    node's optional ``Indices`` output is used) it returns ``(Y, Indices)``: for each maximum the
    flat index into ``x`` (first maximum on ties; spatial part column-major if ``storage_order=1``).
    """
    x, _, kernel, strides, dilations, begin, end, out = _geometry(
        "max_pool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if not return_indices:
        return _pool_reduce(x, kernel, strides, dilations, begin, end, out, _lowest(x.dtype))
    xp = pad_spatial(x, begin, end, _lowest(x.dtype))
    ip = pad_spatial(_flat_indices(x.shape, storage_order), begin, end, -1)
    win, iwin = windows(xp, kernel, strides, dilations, out), windows(ip, kernel, strides, dilations, out)
    taps = np.ndindex(*kernel)
    first = (Ellipsis,) + next(taps)
    best, arg = np.array(win[first]), np.array(iwin[first])
    for tap in taps:
        tap = (Ellipsis,) + tap
        better = win[tap] > best
        np.copyto(best, win[tap], where=better)
        np.copyto(arg, iwin[tap], where=better)
    return best, arg


def _flat_indices(shape, storage_order: int) -> np.ndarray:
    """Each element's flat index in an (N, C, spatial...) tensor; spatial part in C or Fortran order."""
    spatial = int(np.prod(shape[2:], dtype=np.int64))
    inner = np.arange(spatial, dtype=np.int64).reshape(shape[2:], order="F" if storage_order else "C")
    outer = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(shape[:2] + (1,) * (len(shape) - 2))
    return outer * spatial + inner


def _pool_reduce(x: np.ndarray, kernel, strides, dilations, begin, end, out, fill, ufunc=np.maximum) -> np.ndarray:
    """Window reductions (``ufunc``: maximum or add) of x (N, C, D...), as a fresh C-contiguous array (N, C, O...).

    Every pass is one contiguous 1-D ufunc call over a flattened buffer: numpy runs a contiguous
    float32 maximum/add at ~0.1 ns per element but a strided one (stride-2 taps) or one in short rows
    (a row per channel and image row) at 0.5-1 ns, and so does a padding copy with short rows:

    * all spatial dims but the last are padded with ``fill`` (a copy in whole planes: no short rows) and
      reduced one at a time: tap t of dim i is the whole buffer shifted by ``t * dilation * pitch``;
      every position is computed (``stride`` times the kept rows) and positions whose windows cross a
      plane edge are never kept.
    * the last dim is not padded: its taps are shifts by ``t * dilation`` of the same buffer, right for
      every output column whose window lies inside the row.  The few edge columns whose windows reach
      into the padding are recomputed from their valid taps only (padding never wins a max and adds
      nothing to a sum; the average's count is the caller's).
    * the kept positions (every stride-th) are copied once into the output.

    32..272 channels, 3x3 stride 2 (ShuffleNet, ResNet, Inception): 1.5-3x faster than reducing
    strided tap views of a fully padded copy (``bench/pool_bench.py``).
    """
    if _halving(x.shape, kernel, strides, dilations, begin, out):
        return _halve(x, begin, ufunc)
    if _same(x.shape, kernel, strides, dilations, begin, end, out):
        return _same3(x, ufunc)
    k = len(kernel)
    lead = x.ndim - k
    width = x.shape[-1]
    # strided non-last dims over long rows: reduced at their kept positions straight from x (no padding);
    # the others padded and shifted (at stride 1 that measured 1.3-1.5x faster than the row passes)
    kept = [i < k - 1 and strides[i] > 1 and math.prod(x.shape[lead + i + 1:]) >= ROW_MIN for i in range(k)]
    pb = [0 if kept[i] or i == k - 1 else begin[i] for i in range(k)]
    pe = [0 if kept[i] or i == k - 1 else end[i] for i in range(k)]
    cur = np.ascontiguousarray(pad_spatial(x, pb, pe, fill))
    keep = [slice(None) if kept[i] else slice(0, (o - 1) * s + 1, s)
            for i, (o, s) in enumerate(zip(out[:-1], strides[:-1]))]
    for i in range(k):
        pitch = math.prod(cur.shape[lead + i + 1:])
        if i == k - 1:
            rows = cur  # reduced over every dim but the last: what the edge columns read
        if kept[i]:
            cur = _axis_pass(cur, lead + i, kernel[i], strides[i], dilations[i], begin[i], out[i], fill, ufunc)
        elif kernel[i] > 1:
            cur = _shift_pass(cur, dilations[i] * pitch, kernel[i], fill, ufunc)
    full = cur[(slice(None),) * lead + tuple(keep)]
    rows = rows[(slice(None),) * lead + tuple(keep)]
    s, d, b, kk = strides[-1], dilations[-1], begin[-1], kernel[-1]
    y = np.empty(x.shape[:lead] + tuple(out), cur.dtype)
    lo, hi = _inside(width, kk, s, d, b, out[-1])
    if hi > lo:
        y[..., lo:hi] = full[..., lo * s - b:(hi - 1) * s - b + 1:s]
    for o in [*range(lo), *range(hi, out[-1])]:
        _edge(y[..., o], rows, (Ellipsis,), o * s - b, kk, d, width, fill, ufunc)
    return y


def _halving(shape, kernel, strides, dilations, begin, out) -> bool:
    """Whether a pool is a common downsampling one ``_halve`` computes: 2-D, 3x3 windows at stride 2
    starting one before (begin 1: ResNet, ShuffleNet) or at (begin 0, end padding: Inception's Caffe
    exports) twice the output position, even sizes halved."""
    return (tuple(kernel) == (3, 3) and tuple(strides) == (2, 2) and tuple(dilations) == (1, 1)
            and all(b in (0, 1) for b in begin)
            and all(n % 2 == 0 and n >= 2 and o == n // 2 for n, o in zip(shape[-2:], out)))


def _same(shape, kernel, strides, dilations, begin, end, out) -> bool:
    """Whether a pool keeps the size with centred 3x3 windows (stride 1, pad 1: Inception's pool
    branches), on inputs at least 2 wide: ``_same3``."""
    return (tuple(kernel) == (3, 3) and tuple(strides) == (1, 1) and tuple(dilations) == (1, 1)
            and tuple(begin) == (1, 1) and tuple(end) == (1, 1) and min(shape[-2:]) >= 2)


def _halve(x: np.ndarray, begin, ufunc) -> np.ndarray:
    """A ``_halving`` pool as a fresh (..., H/2, W/2).  Every pass but the last is one contiguous ufunc call
    over a whole buffer (numpy vectorises those; its maximum over strided runs is not, at twice an add's
    cost).

    * rows: ``a[r] = x[r] (op) x[r + 1]`` over all rows at once (where it crosses from one image to the next
      nothing reads it); output row i = a[2i] (op) x[2i - 1] for begin 1 (row 0: a[0]), a[2i] (op) x[2i + 2]
      for begin 0 (the last row: a[H - 2]), in whole rows;
    * columns of that half-height result, at every column: ``u[j]`` = the 3 columns around j (begin 1) or
      from j (begin 0), as two shifted passes over the flat buffer; then every other column is kept (one
      strided copy) and the edge column whose window reaches into the padding is recomputed.

    Twice the column work of the kept columns alone, in vectorised passes: 3x3/2 max pools 1.04-1.14x and
    average pools 1.1-1.3x faster than the padded shift passes (ShuffleNet, ResNet; paired, 1 thread).
    """
    x = np.ascontiguousarray(x)
    *lead, h, w = x.shape
    m, h2, w2 = math.prod(lead), h // 2, w // 2
    flat, x3 = x.reshape(-1), x.reshape(m, h, w)
    a = np.empty_like(flat)
    ufunc(flat[:-w], flat[w:], out=a[:-w])  # a[r] = x[r] (op) x[r + 1]; the last row is never read
    a3 = a.reshape(m, h, w)
    r = np.empty((m, h2, w), x.dtype)
    if begin[0]:
        r[:, 0] = a3[:, 0]
        ufunc(a3[:, 2::2], x3[:, 1:h - 2:2], out=r[:, 1:])
    else:
        r[:, h2 - 1] = a3[:, h - 2]
        ufunc(a3[:, 0:h - 2:2], x3[:, 2::2], out=r[:, :h2 - 1])
    flat, rows = r.reshape(-1), r.reshape(m * h2, w)
    u = np.empty_like(flat)
    y = np.empty((m * h2, w2), x.dtype)
    if begin[1]:
        ufunc(flat[:-1], flat[1:], out=u[1:])  # u[j] = r[j - 1] (op) r[j]
        ufunc(u[1:-1], flat[2:], out=u[1:-1])  # ... (op) r[j + 1]
        y[:, 1:] = u.reshape(m * h2, w)[:, 2::2]
        ufunc(rows[:, 0], rows[:, 1], out=y[:, 0])  # column 0: its window's left is padding
    else:
        ufunc(flat[:-1], flat[1:], out=u[:-1])  # u[j] = r[j] (op) r[j + 1]
        ufunc(u[:-2], flat[2:], out=u[:-2])  # ... (op) r[j + 2]
        y[:, :w2 - 1] = u.reshape(m * h2, w)[:, 0:w - 2:2]
        ufunc(rows[:, w - 2], rows[:, w - 1], out=y[:, w2 - 1])  # the last column: its window's right is padding
    return y.reshape(tuple(lead) + (h2, w2))


def _same3(x: np.ndarray, ufunc) -> np.ndarray:
    """A ``_same`` pool (3x3, stride 1, pad 1) as a fresh array of x's shape: per dim, ``v[j] = x[j - 1] (op)
    x[j] (op) x[j + 1]`` as two shifted passes over the whole flat buffer, then the first and last row (or
    column), whose windows reach into the padding (and whose shifted values crossed into the neighbouring
    plane or row), recomputed from their two valid taps.  Inception-v2's 3x3/1 average pools: 4-5 passes
    where the padded shift passes and their edge loops took 2-3x as long."""
    x = np.ascontiguousarray(x)
    *lead, h, w = x.shape
    m = math.prod(lead)
    for step, rows, size in ((w, (m, h, w), h), (1, (m * h, w, 1), w)):
        flat = x.reshape(-1)
        v = np.empty_like(flat)
        ufunc(flat[:-step], flat[step:], out=v[step:])  # v[j] = x[j - 1] (op) x[j]
        ufunc(v[step:-step], flat[2 * step:], out=v[step:-step])  # ... (op) x[j + 1]
        src, dst = x.reshape(rows), v.reshape(rows)
        ufunc(src[:, 0], src[:, 1], out=dst[:, 0])
        ufunc(src[:, size - 2], src[:, size - 1], out=dst[:, size - 1])
        x = v.reshape(x.shape)
    return x.reshape(tuple(lead) + (h, w))


def _shift_pass(cur: np.ndarray, step: int, taps: int, fill, ufunc) -> np.ndarray:
    """``ufunc`` over ``taps`` copies of the flattened ``cur`` shifted by ``step`` each: one contiguous
    pass per tap; the last positions (whose windows would run past the buffer) get ``fill``."""
    flat = cur.reshape(-1)
    size = max(flat.size - (taps - 1) * step, 0)
    acc = np.empty(cur.shape, cur.dtype)
    out = acc.reshape(-1)
    if size:
        ufunc(flat[:size], flat[step:step + size], out=out[:size])
        for t in range(2, taps):
            ufunc(out[:size], flat[t * step:t * step + size], out=out[:size])
    out[size:] = fill
    return acc


def _axis_pass(cur: np.ndarray, axis: int, taps: int, stride: int, dilation: int, begin: int, n_out: int, fill,
               ufunc) -> np.ndarray:
    """``ufunc`` over the window taps along ``axis`` of the unpadded ``cur``, at the kept positions only.

    Outputs whose windows lie inside ``cur`` combine strided tap views (passes in rows of the trailing
    dims: long when those are); the few whose windows reach into the padding combine their valid taps.
    """
    size = cur.shape[axis]
    lead = (slice(None),) * axis
    acc = np.empty(cur.shape[:axis] + (n_out,) + cur.shape[axis + 1:], cur.dtype)
    lo, hi = _inside(size, taps, stride, dilation, begin, n_out)
    if hi > lo:
        first = lo * stride - begin
        views = [cur[lead + (slice(first + t * dilation, first + t * dilation + (hi - lo - 1) * stride + 1, stride),)]
                 for t in range(taps)]
        part = acc[lead + (slice(lo, hi),)]
        if taps == 1:
            np.copyto(part, views[0])
        else:
            ufunc(views[0], views[1], out=part)
            for view in views[2:]:
                ufunc(part, view, out=part)
    for o in [*range(lo), *range(hi, n_out)]:
        _edge(acc[lead + (o,)], cur, lead, o * stride - begin, taps, dilation, size, fill, ufunc)
    return acc


def _inside(size: int, taps: int, stride: int, dilation: int, begin: int, n_out: int) -> tuple[int, int]:
    """[lo, hi): the outputs whose windows lie inside an unpadded axis of ``size``."""
    lo = min(-(-begin // stride), n_out)
    return lo, max(lo, min(n_out, (size - 1 + begin - (taps - 1) * dilation) // stride + 1))


def _edge(dst: np.ndarray, src: np.ndarray, lead, first: int, taps: int, dilation: int, size: int, fill, ufunc):
    """One output slice whose window starts at ``first`` (may be outside [0, size)): its valid taps combined."""
    valid = [q for q in range(first, first + taps * dilation, dilation) if 0 <= q < size]
    if not valid:
        dst[...] = fill
        return
    np.copyto(dst, src[lead + (valid[0],)])
    for q in valid[1:]:
        ufunc(dst, src[lead + (q,)], out=dst)


def _reduce_taps(ufunc, win: np.ndarray, k: int) -> np.ndarray:
    """Combine the window taps with ``ufunc``, one strided tap view at a time.

    Reducing the window axes of the view directly makes numpy walk tiny inner loops per output
    pixel; combining whole tap planes keeps every pass long and vectorised (several times faster).
    """
    taps = np.ndindex(*win.shape[win.ndim - k:])
    lead = (Ellipsis,)
    out = np.array(win[lead + next(taps)])
    for tap in taps:
        ufunc(out, win[lead + tap], out=out)
    return out


def _window_counts(shape, k, kernel, strides, dilations, begin, end, out, pads_count, pads):
    """Per output position: how many window cells the average divides by."""
    if pads_count:  # explicit pads count; ceil-mode overhang does not
        p = [0] * (2 * k) if pads is None else [int(v) for v in pads]
        inner = np.ones([s + p[i] + p[k + i] for i, s in enumerate(shape)])
        mask = pad_spatial(inner, [b - p[i] for i, b in enumerate(begin)],
                           [e - p[k + i] for i, e in enumerate(end)], 0.0)
    else:
        mask = pad_spatial(np.ones(shape), begin, end, 0.0)
    return windows(mask, kernel, strides, dilations, out).sum(axis=tuple(range(k, 2 * k)))


@register("average_pool")
def average_pool(x, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, count_include_pad: int = 0,
                 dilations=None, kernel_shape=None, pads=None, strides=None):
    """ONNX AveragePool (mean over each window; see the module note on what the count includes)."""
    x, k, kernel, strides, dilations, begin, end, out = _geometry(
        "average_pool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    ct = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    if tuple(kernel) == x.shape[2:] and not any(begin) and not any(end) and all(o == 1 for o in out):
        # one window over the whole input (old exports' global pooling): the global mean
        return _spatial_mean(x.astype(ct, copy=False), tuple(range(2, x.ndim))).astype(x.dtype, copy=False)
    total = _pool_reduce(x.astype(ct, copy=False), kernel, strides, dilations, begin, end, out, 0, np.add)
    total /= average_counts(x.shape, kernel, strides, dilations, begin, end, out, auto_pad, count_include_pad,
                            pads, ct)
    return total.astype(x.dtype, copy=False)


def average_counts(xshape, kernel, strides, dilations, begin, end, out, auto_pad, count_include_pad, pads,
                   dtype) -> np.ndarray:
    """What each of AveragePool's outputs divides its sum by (O...), read-only, cached per geometry."""
    auto = auto_pad in ("SAME_UPPER", "SAME_LOWER")
    explicit = None if auto else pads
    if auto and count_include_pad:  # auto pads are real pads here
        explicit = list(begin) + list(end)
    return _cached_counts(tuple(xshape[2:]), len(xshape) - 2, tuple(kernel), tuple(strides), tuple(dilations),
                          tuple(begin), tuple(end), tuple(out), bool(count_include_pad and auto_pad != "VALID"),
                          None if explicit is None else tuple(int(v) for v in explicit), np.dtype(dtype).str)


@functools.lru_cache(maxsize=256)
def _cached_counts(shape, k, kernel, strides, dilations, begin, end, out, pads_count, pads, dtype) -> np.ndarray:
    """``_window_counts`` once per pool geometry (read-only; it depends on the shapes only)."""
    counts = _window_counts(shape, k, kernel, strides, dilations, begin, end, out, pads_count, pads).astype(dtype)
    counts.flags.writeable = False
    return counts


@register("lp_pool")
def lp_pool(x, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations=None, kernel_shape=None,
            p: int = 2, pads=None, strides=None):
    """ONNX LpPool: (sum over the window of |x|^p)^(1/p), zero padding."""
    x, k, kernel, strides, dilations, begin, end, out = _geometry(
        "lp_pool", x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    ct = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    xp = pad_spatial(np.abs(x.astype(ct, copy=False)) ** p, begin, end, 0)
    total = _reduce_taps(np.add, windows(xp, kernel, strides, dilations, out), k)
    return (total ** (1.0 / p)).astype(x.dtype, copy=False)


def _global(name, reduce, doc):
    @register(name)
    def kernel(x):
        x = np.asarray(x)
        if x.ndim < 3:
            raise bad(name, f"input must be (N, C, spatial...), got shape {x.shape}")
        axes = tuple(range(2, x.ndim))
        ct = np.float32 if x.dtype == np.float16 else x.dtype
        return reduce(x.astype(ct, copy=False), axes).astype(x.dtype, copy=False)

    kernel.__doc__ = doc


def _spatial_mean(x: np.ndarray, axes: tuple) -> np.ndarray:
    """The mean of x (N, C, spatial...) over its spatial dims, kept as size 1.  For floats it is a product
    with a ones vector (one BLAS matrix-vector call): numpy's ``mean`` sums each short (N, C) row in a loop
    of its own, 5-7x slower (ShuffleNet's 544 x 7x7: 3-4 against 18-23 us)."""
    count = math.prod(x.shape[2:])
    if x.dtype.kind != "f" or not count or not x.size:
        return x.mean(axis=axes, keepdims=True)
    ones = np.ones(count, x.dtype)
    y = x.reshape(-1, count) @ ones
    y /= x.dtype.type(count)
    return y.reshape(x.shape[:2] + (1,) * len(axes))


_global("global_average_pool", _spatial_mean,
        "ONNX GlobalAveragePool: mean over all spatial dims, kept as size 1.")
_global("global_max_pool", lambda x, a: x.max(axis=a, keepdims=True),
        "ONNX GlobalMaxPool: max over all spatial dims, kept as size 1.")
