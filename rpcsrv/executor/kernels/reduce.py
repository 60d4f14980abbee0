"""Reductions (``Reduce*`` with axes as attribute or input), arg-max/min, cumulative sum."""

from __future__ import annotations

import numpy as np

from . import register


def _axes(x: np.ndarray, axes, noop_with_empty_axes: int):
    if axes is None or (hasattr(axes, "__len__") and len(axes) == 0):
        return None if not noop_with_empty_axes else ()
    return tuple(int(a) % max(x.ndim, 1) for a in np.asarray(axes).reshape(-1))


def _reduction(fn, post=None):
    def kernel(x, axes=None, keepdims=1, noop_with_empty_axes=0):
        ax = _axes(x, axes, noop_with_empty_axes)
        if ax == ():
            return x if post is None else post(x).astype(x.dtype)
        y = fn(x, axis=ax, keepdims=bool(keepdims))
        if post is not None:
            y = post(y)
        return np.asarray(y).astype(x.dtype, copy=False)
    return kernel


def _sum_square(x, axis, keepdims):
    return np.sum(np.square(x.astype(np.float64) if x.dtype.kind == "f" else x), axis=axis, keepdims=keepdims)


def _l1(x, axis, keepdims):
    return np.sum(np.abs(x), axis=axis, keepdims=keepdims)


def _log_sum_exp(x, axis, keepdims):
    x64 = x.astype(np.float64)
    m = np.max(x64, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    y = np.log(np.sum(np.exp(x64 - m), axis=axis, keepdims=True)) + m
    return y if keepdims else np.squeeze(y, axis=axis)


def _empty_safe(fn, init):
    def reducer(x, axis, keepdims):
        if x.size == 0:
            return fn(x, axis=axis, keepdims=keepdims, initial=init)
        return fn(x, axis=axis, keepdims=keepdims)
    return reducer


register("reduce_sum")(_reduction(np.sum))
register("reduce_mean")(_reduction(np.mean))
register("reduce_prod")(_reduction(np.prod))
register("reduce_max")(_reduction(_empty_safe(np.max, -np.inf)))
register("reduce_min")(_reduction(_empty_safe(np.min, np.inf)))
register("reduce_l1")(_reduction(_l1))
register("reduce_l2")(_reduction(_sum_square, np.sqrt))
register("reduce_sum_square")(_reduction(_sum_square))
register("reduce_log_sum")(_reduction(np.sum, np.log))
register("reduce_log_sum_exp")(_reduction(_log_sum_exp))


def _arg(fn):
    def kernel(x, axis=0, keepdims=1, select_last_index=0):
        if select_last_index:
            flipped = np.flip(x, axis=axis)
            y = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            y = fn(x, axis=axis)
        if keepdims:
            y = np.expand_dims(y, axis)
        return y.astype(np.int64)
    return kernel


register("arg_max")(_arg(np.argmax))
register("arg_min")(_arg(np.argmin))


@register("cum_sum")
def cum_sum(x, axis, exclusive=0, reverse=0):
    ax = int(np.asarray(axis).reshape(-1)[0])
    y = np.flip(x, ax) if reverse else x
    out = np.cumsum(y, axis=ax, dtype=x.dtype)
    if exclusive:
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=ax)),
                              np.take(out, range(out.shape[ax] - 1), axis=ax)], axis=ax)
    return np.flip(out, ax) if reverse else out
