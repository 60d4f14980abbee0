"""Reductions (Reduce*, ArgMax/ArgMin), softmax-family, CumSum/CumProd and TopK.

Reduce* take ``axes`` as the second input (opset 18, and ReduceSum from 13) or as the ``axes``
attribute (older opsets).  No axes means all axes, unless ``noop_with_empty_axes=1`` (then the input
passes through).  Sums and means of float16 accumulate in float32.
"""

from __future__ import annotations

import numpy as np

from .registry import bad, ints, norm_axis, register


def _axes(op, x, axes_input, axes_attr):
    if axes_input is not None and axes_attr is not None:
        raise bad(op, "axes given both as input and attribute")
    raw = axes_attr if axes_input is None else axes_input
    if raw is None:
        return None
    return tuple(sorted({norm_axis(a, x.ndim, op) for a in ints(raw, op, "axes")}))


def _reduce(name, fn, doc):
    @register(name)
    def kernel(data, axes_input=None, *, axes=None, keepdims: int = 1, noop_with_empty_axes: int = 0):
        x = np.asarray(data)
        ax = _axes(name, x, axes_input, axes)
        if not ax:
            if noop_with_empty_axes:
                return x
            ax = tuple(range(x.ndim))
        ct = np.float32 if x.dtype == np.float16 else x.dtype
        with np.errstate(divide="ignore"):  # log(0) = -inf is the defined answer (empty log-sums)
            y = fn(x.astype(ct, copy=False), ax, bool(keepdims))
        return np.asarray(y).astype(x.dtype, copy=False)

    kernel.__doc__ = doc


def _logsumexp(x, ax, keep):
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=ax, keepdims=keep))
    m = np.max(x, axis=ax, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    y = np.log(np.sum(np.exp(x - m), axis=ax, keepdims=True)) + m
    return y if keep else np.squeeze(y, axis=ax)


def _extreme(fn, lowest: bool):
    def reduce(x, ax, keep):
        if x.size == 0:  # ONNX: an empty reduction gives the identity of max/min
            if x.dtype.kind == "f":
                fill = -np.inf if lowest else np.inf
            elif x.dtype == np.bool_:
                fill = not lowest
            else:
                info = np.iinfo(x.dtype)
                fill = info.min if lowest else info.max
            return np.full(np.sum(x, axis=ax, keepdims=keep).shape, fill, x.dtype)
        return fn(x, axis=ax, keepdims=keep)
    return reduce


_reduce("reduce_sum", lambda x, a, k: np.sum(x, axis=a, keepdims=k), "ONNX ReduceSum.")
_reduce("reduce_mean", lambda x, a, k: np.mean(x, axis=a, keepdims=k), "ONNX ReduceMean.")
_reduce("reduce_max", _extreme(np.max, True), "ONNX ReduceMax (empty input gives -inf).")
_reduce("reduce_min", _extreme(np.min, False), "ONNX ReduceMin (empty input gives +inf).")
_reduce("reduce_prod", lambda x, a, k: np.prod(x, axis=a, keepdims=k), "ONNX ReduceProd.")
_reduce("reduce_l1", lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k), "ONNX ReduceL1.")
_reduce("reduce_l2", lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)), "ONNX ReduceL2.")
_reduce("reduce_sum_square", lambda x, a, k: np.sum(x * x, axis=a, keepdims=k), "ONNX ReduceSumSquare.")
_reduce("reduce_log_sum", lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)), "ONNX ReduceLogSum.")
_reduce("reduce_log_sum_exp", _logsumexp, "ONNX ReduceLogSumExp (max-shifted, no overflow).")


def _arg(name, fn):
    @register(name)
    def kernel(data, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0):
        x = np.asarray(data)
        a = norm_axis(axis, x.ndim, name)
        if select_last_index:  # search the reversed axis, map the index back
            idx = x.shape[a] - 1 - fn(np.flip(x, axis=a), axis=a)
        else:
            idx = fn(x, axis=a)
        idx = idx.astype(np.int64)
        return np.expand_dims(idx, a) if keepdims else idx

    kernel.__doc__ = f"ONNX {name}: int64 indices along ``axis`` (first occurrence unless select_last_index)."


_arg("arg_max", np.argmax)
_arg("arg_min", np.argmin)


def _shift(xc: np.ndarray, a: int) -> np.ndarray:
    """A per-row shift for softmax along axis ``a``: the row maximum, NaN-free where possible.

    ``fmax.reduce`` ignores NaN (np.max returns it) and is ~1.4x faster on 64-wide rows; the
    softmax results are the same either way, since a NaN in a row makes the row's sum, and so the
    whole row, NaN.  Rows of at most 16 along the last axis are folded in halves instead: numpy's
    reductions pay ~60 ns per row, four maximum passes over the whole array cost less.
    """
    n = xc.shape[a] if xc.ndim else 1
    if a != xc.ndim - 1 or not 2 <= n <= 16:
        return np.fmax.reduce(xc, axis=a, keepdims=True)
    y = xc
    while y.shape[-1] > 1:
        n = y.shape[-1]
        h = n // 2
        z = np.maximum(y[..., :h], y[..., h:2 * h])
        if n % 2:
            np.maximum(z[..., :1], y[..., 2 * h:], out=z[..., :1])
        y = z
    return y


def _softmax_parts(x, axis, op):
    x = np.asarray(x)
    a = norm_axis(axis, x.ndim, op)
    ct = np.float32 if x.dtype == np.float16 else x.dtype
    xc = x.astype(ct, copy=False)
    with np.errstate(invalid="ignore"):  # an all -inf row gives NaN, as in ONNX
        shifted = xc - _shift(xc, a)
    return x, a, shifted


@register("softmax")
def softmax(x, *, axis: int = -1):
    """ONNX Softmax (opset 13 semantics: along one axis)."""
    x, a, shifted = _softmax_parts(x, axis, "softmax")
    e = np.exp(shifted, out=shifted)  # ``shifted`` is our own temporary
    e /= np.add.reduce(e, axis=a, keepdims=True)
    return e.astype(x.dtype, copy=False)


@register("log_softmax")
def log_softmax(x, *, axis: int = -1):
    """ONNX LogSoftmax (opset 13 semantics: along one axis)."""
    x, a, shifted = _softmax_parts(x, axis, "log_softmax")
    y = shifted - np.log(np.sum(np.exp(shifted), axis=a, keepdims=True))
    return y.astype(x.dtype, copy=False)


@register("hardmax")
def hardmax(x, *, axis: int = -1):
    """ONNX Hardmax: 1 at the first maximum along ``axis``, 0 elsewhere."""
    x = np.asarray(x)
    a = norm_axis(axis, x.ndim, "hardmax")
    y = np.zeros_like(x)
    np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=a), a), 1, axis=a)
    return y


def _cumulative(name: str, scan, identity):
    @register(name)
    def kernel(x, axis, *, exclusive: int = 0, reverse: int = 0):
        x = np.asarray(x)
        a = norm_axis(ints(axis, name, "axis")[0], x.ndim, name)
        src = np.flip(x, axis=a) if reverse else x
        y = scan(src, axis=a, dtype=x.dtype)
        if exclusive:  # shift by one along the axis, the op's identity first
            y = np.concatenate([identity(np.take(y, [0], axis=a)), np.delete(y, -1, axis=a)], axis=a)
        return np.flip(y, axis=a) if reverse else y

    kernel.__doc__ = f"ONNX {name}: along the axis given as a scalar tensor input (exclusive, reverse)."


_cumulative("cum_sum", np.cumsum, np.zeros_like)
_cumulative("cum_prod", np.cumprod, np.ones_like)


@register("top_k")
def top_k(x, k, *, axis: int = -1, largest: int = 1, sorted: int = 1):  # noqa: A002 - ONNX name
    """ONNX TopK: (values, int64 indices); ties keep the lower index first, as ONNX requires."""
    x = np.asarray(x)
    a = norm_axis(axis, x.ndim, "top_k")
    kk = ints(k, "top_k", "K")[0]
    if not 0 <= kk <= x.shape[a]:
        raise bad("top_k", f"K={kk} out of range for axis of size {x.shape[a]}")
    if largest:  # stable descending: sort the reversed axis ascending, reverse, map indices back
        idx = x.shape[a] - 1 - np.flip(np.argsort(np.flip(x, axis=a), axis=a, kind="stable"), axis=a)
    else:
        idx = np.argsort(x, axis=a, kind="stable")
    idx = np.take(idx, np.arange(kk), axis=a).astype(np.int64)
    return np.take_along_axis(x, idx, axis=a), idx
