"""Less common ops that are cheap to do exactly: Dropout (inference), OneHot, NonZero, Compress,
EyeLike, ScatterND, ReverseSequence, Constant, QuantizeLinear, DequantizeLinear."""

from __future__ import annotations

import numpy as np

from .onnx_dtypes import onnx_dtype
from .registry import bad, ints, norm_axis, register


@register("dropout")
def dropout(data, ratio_input=None, training_mode=None, *, seed=None, ratio=None, is_test=1):
    """ONNX Dropout at inference: (data, all-true mask).  Training mode is refused.

    ``ratio`` (an input from opset 12, an attribute before) does not change inference; ``seed``
    only drives training-mode randomness; ``is_test`` is opset 6's inference switch.
    """
    rate = ratio_input if ratio_input is not None else ratio
    training = (training_mode is not None and bool(np.asarray(training_mode))) or not is_test
    if training and (rate is None or float(np.asarray(rate)) != 0.0):
        raise bad("dropout", "training mode (random masking) is not supported")
    x = np.asarray(data)
    return x, np.ones(x.shape, dtype=bool)


@register("one_hot")
def one_hot(indices, depth, values, *, axis: int = -1):
    """ONNX OneHot: ``values`` = [off, on]; negative indices count from ``depth``, others are off."""
    idx = np.asarray(indices)
    d = int(np.asarray(depth).reshape(-1)[0])
    off, on = np.asarray(values).reshape(-1)[:2]
    a = norm_axis(axis, idx.ndim + 1, "one_hot")
    idx = np.where(idx < 0, idx + d, idx).astype(np.int64)
    shape = [1] * (idx.ndim + 1)
    shape[a] = d
    hot = np.expand_dims(idx, a) == np.arange(d).reshape(shape)
    return np.where(hot, on, off).astype(np.asarray(values).dtype)


@register("non_zero")
def non_zero(x):
    """ONNX NonZero: int64 (rank, count) coordinates of the non-zero elements, row-major order."""
    x = np.asarray(x)
    return np.array(np.nonzero(x if x.ndim else x.reshape(1)), dtype=np.int64).reshape(max(x.ndim, 1), -1)


@register("compress")
def compress(data, condition, *, axis=None):
    """ONNX Compress: keep the slices where ``condition`` is true (flattened input without axis)."""
    x, cond = np.asarray(data), np.asarray(condition, dtype=bool)
    if axis is None:
        return np.compress(cond, x.reshape(-1))
    return np.compress(cond, x, axis=norm_axis(axis, x.ndim, "compress"))


@register("eye_like")
def eye_like(x, *, dtype=None, k: int = 0):
    """ONNX EyeLike: ones on diagonal ``k`` of a 2-D tensor shaped like ``x``."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise bad("eye_like", f"input must be 2-D, got shape {x.shape}")
    dt = x.dtype if dtype is None else onnx_dtype(dtype, "eye_like")
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=dt)


@register("scatter_nd")
def scatter_nd(data, indices, updates, *, reduction: str = "none"):
    """ONNX ScatterND on a copy of ``data`` (reduction none/add/mul/max/min)."""
    x = np.array(data, copy=True)
    idx = np.asarray(indices).astype(np.int64)
    depth = idx.shape[-1]
    where = tuple(np.moveaxis(np.where(idx < 0, idx + np.array(x.shape[:depth]), idx), -1, 0))
    upd = np.asarray(updates)
    ufuncs = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    if reduction == "none":
        x[where] = upd
    elif reduction in ufuncs:
        ufuncs[reduction].at(x, where, upd)
    else:
        raise bad("scatter_nd", f"unknown reduction {reduction!r}")
    return x


@register("reverse_sequence")
def reverse_sequence(x, sequence_lens, *, batch_axis: int = 1, time_axis: int = 0):
    """ONNX ReverseSequence: reverse the first ``sequence_lens[b]`` steps of each batch entry."""
    x = np.asarray(x)
    y = x.copy()
    lens = ints(sequence_lens, "reverse_sequence", "sequence_lens")
    for b, n in enumerate(lens):
        src = [slice(None)] * x.ndim
        src[batch_axis], src[time_axis] = b, slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        dst = list(src)
        dst[time_axis] = slice(0, n)
        y[tuple(dst)] = x[tuple(src)]
    return y


@register("constant")
def constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None):
    """ONNX Constant (numeric forms): ``value`` is a tensor or nested JSON list (then float32)."""
    given = [(k, v) for k, v in (("value", value), ("value_float", value_float), ("value_floats", value_floats),
                                 ("value_int", value_int), ("value_ints", value_ints)) if v is not None]
    if len(given) != 1:
        raise bad("constant", "exactly one value attribute is required")
    key, v = given[0]
    if key.startswith("value_int"):
        return np.asarray(v, dtype=np.int64)
    if isinstance(v, np.ndarray):
        return v
    return np.asarray(v, dtype=np.float32)


def _along(param, x_ndim: int, axis: int, block_size: int, x_shape, op: str) -> np.ndarray:
    """A scale/zero-point broadcast against x: scalar, per-axis (1-D) or blocked (same rank as x)."""
    p = np.asarray(param)
    if p.ndim == 0 or p.size == 1 and not block_size:
        return p.reshape(())
    a = norm_axis(axis, x_ndim, op)
    if block_size:
        if p.ndim != x_ndim:
            raise bad(op, "blocked quantization needs a scale of the input's rank")
        return np.repeat(p, block_size, axis=a)[tuple(slice(0, d) for d in x_shape)]
    if p.ndim != 1 or p.shape[0] != x_shape[a]:
        raise bad(op, f"per-axis parameter of shape {p.shape} does not match axis {a} of {tuple(x_shape)}")
    shape = [1] * x_ndim
    shape[a] = -1
    return p.reshape(shape)


@register("dequantize_linear")
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis: int = 1, block_size: int = 0,
                      output_dtype: int = 0):
    """ONNX DequantizeLinear: (x - zero_point) * scale, per tensor, per axis or per block.

    The result has the scale's dtype unless ``output_dtype`` names another float type.
    """
    x = np.asarray(x)
    scale = _along(x_scale, x.ndim, axis, block_size, x.shape, "dequantize_linear")
    ct = np.float32 if np.asarray(x_scale).dtype == np.float16 else np.asarray(x_scale).dtype
    y = x.astype(ct)
    if x_zero_point is not None:
        y = y - _along(x_zero_point, x.ndim, axis, block_size, x.shape, "dequantize_linear").astype(ct)
    y = y * scale.astype(ct)
    out = np.asarray(x_scale).dtype if not output_dtype else onnx_dtype(output_dtype, "dequantize_linear")
    return y.astype(out, copy=False)


@register("quantize_linear")
def quantize_linear(x, y_scale, y_zero_point=None, *, axis: int = 1, block_size: int = 0,
                    output_dtype: int = 0, precision: int = 0, saturate: int = 1):
    """ONNX QuantizeLinear to 8/16-bit integers: saturate(round_half_even(x / scale) + zero_point).

    The integer type is the zero point's, else ``output_dtype``, else uint8.  ``saturate`` only
    concerns float8 targets and ``precision`` the internal float type; both are accepted and ignored
    (we divide in float32, or float64 for float64 inputs).
    """
    x = np.asarray(x)
    if y_zero_point is not None:
        out = np.asarray(y_zero_point).dtype
    else:
        out = onnx_dtype(output_dtype, "quantize_linear") if output_dtype else np.dtype(np.uint8)
    if out.kind not in "iu":
        raise bad("quantize_linear", f"only integer targets are supported, got {out}")
    ct = np.float64 if x.dtype == np.float64 else np.float32
    scale = _along(y_scale, x.ndim, axis, block_size, x.shape, "quantize_linear").astype(ct)
    q = np.rint(x.astype(ct) / scale)
    if y_zero_point is not None:
        q += _along(y_zero_point, x.ndim, axis, block_size, x.shape, "quantize_linear").astype(ct)
    info = np.iinfo(out)
    return np.clip(q, info.min, info.max).astype(out)
