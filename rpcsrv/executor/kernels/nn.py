"""Neural-network kernels: convolution (im2col + BLAS matmul), pooling, normalization, softmax,
dense layers.  Spatial ops work for any number of spatial dimensions (1-D, 2-D, 3-D)."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import apply_activation, register


def _pads(auto_pad: str, pads, in_shape, kernel, strides, dilations, ceil_mode=0):
    """Begin/end padding per spatial axis, following ONNX's auto_pad rules."""
    n = len(in_shape)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-in_shape[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_shape[i])
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
            begin.append(b)
            end.append(e)
        return begin, end
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    pads = list(pads) if pads is not None else [0] * (2 * n)
    return pads[:n], pads[n:]


def _windows(x: np.ndarray, kernel, strides, dilations, begin, end, fill, ceil_mode=0):
    """Padded sliding windows: (N, C, *out_spatial, *kernel)."""
    n = len(kernel)
    extra = [0] * n
    if ceil_mode:
        for i in range(n):
            span = x.shape[2 + i] + begin[i] + end[i] - (kernel[i] - 1) * dilations[i] - 1
            out = math.ceil(span / strides[i]) + 1
            if (out - 1) * strides[i] >= x.shape[2 + i] + begin[i]:
                out -= 1  # the last window must start inside the input or left padding
            extra[i] = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
                           - (x.shape[2 + i] + begin[i] + end[i]))
    width = [(0, 0), (0, 0)] + [(begin[i], end[i] + extra[i]) for i in range(n)]
    if any(w != (0, 0) for w in width):
        x = np.pad(x, width, constant_values=fill)
    span = [(kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    win = sliding_window_view(x, span, axis=tuple(range(2, 2 + n)))
    idx = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides) + \
        tuple(slice(None, None, d) for d in dilations)
    return win[idx], extra


@register("conv")
def conv(x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None, activation=None, activation_attrs=None):
    n = x.ndim - 2
    kernel = list(kernel_shape or w.shape[2:])
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    begin, end = _pads(auto_pad, pads, x.shape[2:], kernel, strides, dilations)
    win, _ = _windows(x, kernel, strides, dilations, begin, end, 0)
    batch, c = x.shape[:2]
    out_sp = win.shape[2:2 + n]
    m = w.shape[0]
    cg, mg = c // group, m // group
    ksize = int(np.prod(kernel))
    outs = []
    for g in range(group):
        # im2col: (N, *out, C/g * K) @ (C/g * K, M/g) -> one BLAS matmul per group
        cols = win[:, g * cg:(g + 1) * cg]
        cols = np.moveaxis(cols, 1, 1 + n).reshape(batch * int(np.prod(out_sp)), cg * ksize)
        wg = w[g * mg:(g + 1) * mg].reshape(mg, cg * ksize)
        outs.append((cols @ wg.T).reshape(batch, *out_sp, mg))
    y = np.concatenate(outs, axis=-1) if group > 1 else outs[0]
    y = np.moveaxis(y, -1, 1)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return np.ascontiguousarray(apply_activation(y.astype(x.dtype, copy=False), activation, activation_attrs))


def _pool(x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode, fill):
    n = x.ndim - 2
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    begin, end = _pads(auto_pad, pads, x.shape[2:], kernel_shape, strides, dilations)
    win, extra = _windows(x, kernel_shape, strides, dilations, begin, end, fill, ceil_mode)
    return win, begin, end, extra, strides, dilations


@register("max_pool")
def max_pool(x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None,
             storage_order=0, strides=None):
    fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    win, *_ = _pool(x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode, fill)
    n = x.ndim - 2
    return win.max(axis=tuple(range(-n, 0))).astype(x.dtype)


@register("average_pool")
def average_pool(x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 pads=None, strides=None):
    n = x.ndim - 2
    win, begin, end, extra, strides, dilations = _pool(x, kernel_shape, auto_pad, pads, strides,
                                                      dilations, ceil_mode, 0)
    axes = tuple(range(-n, 0))
    total = win.sum(axis=axes, dtype=np.float64)
    # how many elements of each window count: real ones, plus explicit padding if asked
    ones = np.ones((1, 1) + x.shape[2:])
    if count_include_pad:
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(begin[i], end[i]) for i in range(n)], constant_values=1)
        cw, _ = _windows(ones, kernel_shape, strides, dilations, [0] * n, extra, 0)
    else:
        cw, _ = _windows(ones, kernel_shape, strides, dilations, begin, [end[i] + extra[i] for i in range(n)], 0)
    count = cw.sum(axis=axes)
    return (total / count).astype(x.dtype)


@register("lp_pool")
def lp_pool(x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, p=2, pads=None, strides=None):
    n = x.ndim - 2
    win, *_ = _pool(x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode, 0)
    return np.power(np.power(np.abs(win), p).sum(axis=tuple(range(-n, 0))), 1.0 / p).astype(x.dtype)


@register("global_average_pool")
def global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)


@register("global_max_pool")
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


def _channel(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape((1, -1) + (1,) * (ndim - 2))


@register("batch_normalization")
def batch_normalization(x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0):
    """Inference form: y = (x - mean) / sqrt(var + eps) * scale + bias."""
    inv = scale / np.sqrt(var + epsilon)
    y = x * _channel(inv, x.ndim) + _channel(bias - mean * inv, x.ndim)
    return y.astype(x.dtype)


@register("instance_normalization")
def instance_normalization(x, scale, bias, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return ((x - mu) / np.sqrt(var + epsilon) * _channel(scale, x.ndim) + _channel(bias, x.ndim)).astype(x.dtype)


@register("layer_normalization")
def layer_normalization(x, scale, bias=None, axis=-1, epsilon=1e-5, stash_type=1):
    axes = tuple(range(axis % x.ndim, x.ndim))
    x32 = x.astype(np.float32) if x.dtype == np.float16 else x
    mu = x32.mean(axis=axes, keepdims=True)
    var = ((x32 - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x32 - mu) / np.sqrt(var + epsilon) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype)


@register("lrn")
def lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    sq = np.square(x)
    c = x.shape[1]
    pad_lo, pad_hi = (size - 1) // 2, size // 2
    padded = np.pad(sq, [(0, 0), (pad_lo, pad_hi)] + [(0, 0)] * (x.ndim - 2))
    acc = sum(padded[:, i:i + c] for i in range(size))
    return (x / np.power(bias + alpha / size * acc, beta)).astype(x.dtype)


@register("softmax")
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


@register("log_softmax")
def log_softmax(x, axis=-1):
    shifted = x - x.max(axis=axis, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype)


@register("hardmax")
def hardmax(x, axis=-1):
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out


@register("gemm")
def gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None, activation_attrs=None):
    a = a.T if transA else a
    b = b.T if transB else b
    y = a @ b
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return apply_activation(y.astype(a.dtype, copy=False), activation, activation_attrs)


@register("matmul")
def matmul(a, b, activation=None, activation_attrs=None):
    return apply_activation(np.matmul(a, b), activation, activation_attrs)
