"""Normalizations: BatchNormalization (inference), InstanceNormalization, LayerNormalization,
GroupNormalization, LRN, LpNormalization, MeanVarianceNormalization, RMSNormalization.

Statistics are computed in float32 (or float64 for float64 inputs) whatever the input dtype, then
the result is cast back, so float16 models do not lose the variance to rounding.
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import apply_activation, bad, norm_axis, register


def _ct(dtype):
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _channel(v, k, ct):
    return np.asarray(v).astype(ct, copy=False).reshape((-1,) + (1,) * k)


@register("batch_normalization")
def batch_normalization(x, scale, b, mean, var, *, epsilon: float = 1e-5, momentum: float = 0.9,
                        training_mode: int = 0, spatial: int = 1, is_test: int = 1,
                        activation=None, activation_attrs=None):
    """ONNX BatchNormalization in inference mode: (x - mean) / sqrt(var + eps) * scale + B.

    ``momentum`` only matters for training and is ignored; ``spatial``/``is_test`` (opsets < 9 / < 7)
    are accepted only at their inference values.  ``training_mode=1`` is refused.  ``activation``: the
    BatchNormalization+Relu composite (the compiler's pre-activation pattern, DenseNet's).

    The per-channel map ``x * s + t`` runs as three passes over one new buffer: multiply into it, add
    and relu in place (relu against a zeros array, see ``registry.zeros``).  In DenseNet this replaced
    BN, Mul, Add, Relu: five passes and four buffers over ~13M elements per run.
    """
    if training_mode or not is_test or not spatial:
        raise bad("batch_normalization", "only inference mode (training_mode=0, spatial=1) is supported")
    x = np.asarray(x)
    ct = _ct(x.dtype)
    k = x.ndim - 2
    inv = _channel(scale, k, ct) / np.sqrt(_channel(var, k, ct) + ct.type(epsilon))
    shift = _channel(b, k, ct) - _channel(mean, k, ct) * inv
    if x.dtype == ct and x.ndim > 2:
        # (N, C, spatial) rows: a broadcast over one long inner axis (numpy's fastest layout for it)
        rows = x.reshape(x.shape[0], x.shape[1], -1)
        y = np.multiply(rows, inv.reshape(-1, 1))
        y += shift.reshape(-1, 1)
        y = y.reshape(x.shape)
    else:
        y = x.astype(ct, copy=False) * inv
        y += shift
        y = y.astype(x.dtype, copy=False)
    return apply_activation(y, activation, activation_attrs, "batch_normalization")


@register("instance_normalization")
def instance_normalization(x, scale, b, *, epsilon: float = 1e-5):
    """ONNX InstanceNormalization: per (sample, channel) mean/variance over the spatial dims."""
    x = np.asarray(x)
    ct = _ct(x.dtype)
    xc = x.astype(ct, copy=False)
    axes = tuple(range(2, x.ndim))
    mean = xc.mean(axis=axes, keepdims=True)
    var = xc.var(axis=axes, keepdims=True)
    k = x.ndim - 2
    y = (xc - mean) / np.sqrt(var + ct.type(epsilon)) * _channel(scale, k, ct) + _channel(b, k, ct)
    return y.astype(x.dtype, copy=False)


@register("layer_normalization")
def layer_normalization(x, scale, b=None, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1):
    """ONNX LayerNormalization: normalize over dims ``axis..`` then scale (and shift).

    Returns (Y, Mean, InvStdDev) as ONNX does; the statistics keep the reduced dims as 1 and are
    float32 (``stash_type`` 1, the only value ONNX defines; float64 inputs keep float64).  The
    normalized dims are flattened into rows, so every reduction is one ``add.reduce`` over the last
    axis and every other step runs in place on one buffer (7 passes; 1x64x128: 21 -> 16 us).
    """
    x = np.asarray(x)
    ct = _ct(x.dtype)
    a = norm_axis(axis, x.ndim, "layer_normalization")
    stat_shape = x.shape[:a] + (1,) * (x.ndim - a)
    n = math.prod(x.shape[a:])
    rows = x.astype(ct, copy=False).reshape(-1, n)
    mean = np.add.reduce(rows, axis=1, keepdims=True)
    mean /= n
    d = rows - mean
    var = np.add.reduce(d * d, axis=1, keepdims=True)
    var /= n
    var += ct.type(epsilon)
    inv_std = np.sqrt(var, out=var)
    np.divide(1.0, inv_std, out=inv_std)
    d *= inv_std
    y = d.reshape(x.shape)
    y *= np.asarray(scale).astype(ct, copy=False)
    if b is not None:
        y += np.asarray(b).astype(ct, copy=False)
    return y.astype(x.dtype, copy=False), mean.reshape(stat_shape), inv_std.reshape(stat_shape)


@register("group_normalization")
def group_normalization(x, scale, b, *, epsilon: float = 1e-5, num_groups: int, stash_type: int = 1):
    """ONNX GroupNormalization (opset 21: per-channel scale and bias)."""
    x = np.asarray(x)
    ct = _ct(x.dtype)
    n, c = x.shape[:2]
    if c % num_groups:
        raise bad("group_normalization", f"{c} channels do not split into {num_groups} groups")
    g = x.astype(ct, copy=False).reshape(n, num_groups, -1)
    y = (g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + ct.type(epsilon))
    k = x.ndim - 2
    y = y.reshape(x.shape) * _channel(scale, k, ct) + _channel(b, k, ct)
    return y.astype(x.dtype, copy=False)


@register("rms_normalization")
def rms_normalization(x, scale, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1):
    """ONNX RMSNormalization: x / sqrt(mean(x^2 over dims axis..) + eps) * scale."""
    x = np.asarray(x)
    ct = _ct(x.dtype)
    axes = tuple(range(norm_axis(axis, x.ndim, "rms_normalization"), x.ndim))
    xc = x.astype(ct, copy=False)
    y = xc / np.sqrt(np.mean(xc * xc, axis=axes, keepdims=True) + ct.type(epsilon))
    return (y * np.asarray(scale).astype(ct, copy=False)).astype(x.dtype, copy=False)


@register("lrn")
def lrn(x, *, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0, size: int):
    """ONNX LRN: x / (bias + alpha/size * sum of squares over ``size`` neighbouring channels)^beta."""
    x = np.asarray(x)
    ct = _ct(x.dtype)
    xc = x.astype(ct, copy=False)
    sq = xc * xc
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    # channel-window sums through a cumulative sum along C (zero padded)
    cs = np.cumsum(np.pad(sq, [(0, 0), (lo + 1, hi)] + [(0, 0)] * (x.ndim - 2)), axis=1)
    window = cs[:, size:size + c] - cs[:, :c]
    y = xc / (ct.type(bias) + ct.type(alpha / size) * window) ** ct.type(beta)
    return y.astype(x.dtype, copy=False)


@register("lp_normalization")
def lp_normalization(x, *, axis: int = -1, p: int = 2):
    """ONNX LpNormalization: x divided by its L1 or L2 norm along ``axis`` (zero norms give 0)."""
    x = np.asarray(x)
    if p not in (1, 2):
        raise bad("lp_normalization", f"p must be 1 or 2, got {p}")
    a = norm_axis(axis, x.ndim, "lp_normalization")
    norm = np.sum(np.abs(x), axis=a, keepdims=True) if p == 1 else np.sqrt(np.sum(x * x, axis=a, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm == 0, 0, x / norm).astype(x.dtype, copy=False)


@register("mean_variance_normalization")
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    """ONNX MeanVarianceNormalization: (x - mean) / std over ``axes`` (epsilon 1e-9 as ONNX)."""
    x = np.asarray(x)
    ax = tuple(norm_axis(int(a), x.ndim, "mean_variance_normalization") for a in axes)
    mean = x.mean(axis=ax, keepdims=True)
    std = np.sqrt(np.mean((x - mean) ** 2, axis=ax, keepdims=True))
    return ((x - mean) / (std + 1e-9)).astype(x.dtype, copy=False)
