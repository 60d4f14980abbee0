"""The int8 ops of onnxruntime's quantizer (its ``com.microsoft`` contrib ops, and ONNX's
DynamicQuantizeLinear), as numpy reference kernels.

Each computes what ``rpcsrv.loader.opset.quant`` says of quantized tensors: the real values an int8
tensor stands for, the op on them, the result quantized (round half to even, saturate), and a fused
``relu``/``clip`` as a clamp of the output.  Elementwise ops with one input (Sigmoid, LeakyRelu) are a
256-entry table over the input's integers, as onnxruntime computes them; sums (the average pools) are
exact integer sums requantized once.
"""

from __future__ import annotations

import numpy as np

from ....loader.opset.quant import QuantParams, clamp_bounds, dequantize, quantize, requantize
from ..pool.pool import average_pool
from ..reduce import softmax
from ..registry import register


def _params(scale, zero_point, like=None) -> QuantParams:
    """Per-tensor parameters; a zero point left out is 0 of ``like``'s type (the tensor's)."""
    dtype = np.asarray(like).dtype if zero_point is None and like is not None else None
    params = QuantParams.of(scale, zero_point, None, dtype)
    if params.per_channel:
        raise ValueError("this op takes per-tensor scales and zero points only")
    return params


def _store(real: np.ndarray, out: QuantParams, activation=None, activation_attrs=None) -> np.ndarray:
    """``real`` quantized to ``out``, clamped to the fused activation's range."""
    lo, hi = clamp_bounds(activation, activation_attrs, out)
    q = quantize(real, out)
    return np.clip(q, lo, hi).astype(out.dtype) if activation else q


def _binary(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, combine,
            activation, activation_attrs):
    pa, pb = _params(a_scale, a_zero_point, a), _params(b_scale, b_zero_point, b)
    out = _params(c_scale, c_zero_point, a)
    return _store(combine(dequantize(a, pa), dequantize(b, pb)), out, activation, activation_attrs)


@register("q_linear_add")
def q_linear_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None, *,
                 activation=None, activation_attrs=None):
    """com.microsoft QLinearAdd (broadcasting): ``a + b`` of the real values, quantized."""
    return _binary(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, np.add,
                   activation, activation_attrs)


@register("q_linear_mul")
def q_linear_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None, *,
                 activation=None, activation_attrs=None):
    """com.microsoft QLinearMul (broadcasting): ``a * b`` of the real values, quantized."""
    return _binary(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point, np.multiply,
                   activation, activation_attrs)


@register("q_linear_concat")
def q_linear_concat(y_scale, y_zero_point, *inputs, axis):
    """com.microsoft QLinearConcat: ``inputs`` as (x, x_scale, x_zero_point) triples, each requantized to
    the output's parameters (copied where they are the same)."""
    if not inputs or len(inputs) % 3:
        raise ValueError(f"q_linear_concat takes (x, scale, zero point) triples after its two inputs, got "
                         f"{len(inputs)} input(s) there")
    out = _params(y_scale, y_zero_point)
    parts = []
    for x, scale, zp in zip(inputs[0::3], inputs[1::3], inputs[2::3]):
        p = _params(scale, zp, x)
        parts.append(np.asarray(x) if p.same_as(out) else quantize(dequantize(x, p), out))
    return np.concatenate(parts, axis=axis)


@register("q_linear_global_average_pool")
def q_linear_global_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last: int = 0):
    """com.microsoft QLinearGlobalAveragePool (channels first): the exact sum of each channel's centred
    integers, requantized once by ``x_scale / (y_scale * count)``."""
    px, out = _params(x_scale, x_zero_point, x), _params(y_scale, y_zero_point, x)
    x = np.asarray(x)
    axes = tuple(range(2, x.ndim))
    count = int(np.prod([x.shape[a] for a in axes]))
    acc = (x.astype(np.int64) - int(px.zero_point)).sum(axis=axes, keepdims=True)
    mult = np.float32(px.scale) / (np.float32(out.scale) * np.float32(count))
    return requantize(acc, mult, out.zero_point)


@register("q_linear_average_pool")
def q_linear_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *,
                          auto_pad: str = "NOTSET", ceil_mode: int = 0, channels_last: int = 0,
                          count_include_pad: int = 0, kernel_shape, pads=None, strides=None):
    """com.microsoft QLinearAveragePool (channels first): the mean of each window's real values (padding
    counts as the real value 0), quantized."""
    px = _params(x_scale, x_zero_point, x)
    out = _params(y_scale, y_zero_point, x)
    centred = np.asarray(x).astype(np.float64) - float(px.zero_point)
    mean = average_pool(centred, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                        kernel_shape=kernel_shape, pads=pads, strides=strides)
    return quantize((mean * float(px.scale)).astype(np.float32), out)


def _table(x, x_scale, x_zero_point, y_scale, y_zero_point, fn) -> np.ndarray:
    """An elementwise op of one int8 input as onnxruntime computes it: a table of ``quantize(fn(v))`` over
    every integer of the input's type."""
    x = np.asarray(x)
    px, out = _params(x_scale, x_zero_point, x), _params(y_scale, y_zero_point, x)
    lo, hi = px.bounds
    domain = np.arange(lo, hi + 1).astype(px.dtype)
    table = quantize(fn(dequantize(domain, px)), out)
    return table[x.astype(np.int64) - lo]


@register("q_linear_sigmoid")
def q_linear_sigmoid(x, x_scale, x_zero_point, y_scale, y_zero_point=None):
    """com.microsoft QLinearSigmoid."""
    return _table(x, x_scale, x_zero_point, y_scale, y_zero_point,
                  lambda v: (1.0 / (1.0 + np.exp(-v.astype(np.float64)))).astype(np.float32))


@register("q_linear_leaky_relu")
def q_linear_leaky_relu(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, alpha: float = 0.01):
    """com.microsoft QLinearLeakyRelu."""
    return _table(x, x_scale, x_zero_point, y_scale, y_zero_point,
                  lambda v: np.where(v >= 0, v, v * np.float32(alpha)).astype(np.float32))


@register("q_linear_softmax")
def q_linear_softmax(x, x_scale, x_zero_point, y_scale, y_zero_point, *, axis: int = -1, opset):
    """com.microsoft QLinearSoftmax: along ``axis`` (``opset`` >= 13), or over the trailing dimensions from
    ``axis`` on, as a 2-D matrix (``opset`` <= 12, Softmax-1's semantics)."""
    x = np.asarray(x)
    px, out = _params(x_scale, x_zero_point, x), _params(y_scale, y_zero_point, x)
    real = dequantize(x, px)
    if opset < 13:
        a = axis % x.ndim
        flat = real.reshape(int(np.prod(x.shape[:a], dtype=np.int64)), -1)
        y = softmax(flat, axis=-1).reshape(x.shape)
    else:
        y = softmax(real, axis=axis)
    return quantize(y, out)


def dynamic_params(x) -> QuantParams:
    """DynamicQuantizeLinear's uint8 parameters for ``x``: the range [min(x, 0), max(x, 0)] over 0..255."""
    x = np.asarray(x, np.float32)
    lo = min(np.float32(0), x.min()) if x.size else np.float32(0)
    hi = max(np.float32(0), x.max()) if x.size else np.float32(0)
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255))
    if scale == 0:
        return QuantParams.of(np.float32(0), np.uint8(0))
    zp = np.clip(np.rint(np.float32(0) - np.float32(lo) / scale), 0, 255)
    return QuantParams.of(scale, np.uint8(zp))


@register("dynamic_quantize_linear")
def dynamic_quantize_linear(x):
    """ONNX DynamicQuantizeLinear: ``(y, y_scale, y_zero_point)``, uint8."""
    p = dynamic_params(x)
    y = np.zeros(np.shape(x), np.uint8) if p.scale == 0 else quantize(x, p)
    return y, np.asarray(p.scale, np.float32), np.asarray(p.zero_point, np.uint8)


def _centred(q, zero_point, where: str) -> np.ndarray:
    """Integers minus their zero point (per tensor; ``"col"``: one per column of the last axis)."""
    q = np.asarray(q).astype(np.int64)
    if zero_point is None:
        return q
    zp = np.asarray(zero_point).astype(np.int64)
    return q - (zp.reshape(-1) if zp.size > 1 and where == "col" else zp.reshape(()))


def _scale(s, where: str) -> np.ndarray:
    s = np.asarray(s, np.float32)
    return s.reshape(-1) if s.size > 1 and where == "col" else s.reshape(())


@register("matmul_integer_to_float")
def matmul_integer_to_float(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
    """com.microsoft MatMulIntegerToFloat: ``(a - a_zp) @ (b - b_zp) * a_scale * b_scale + bias``, float32
    (b's scale and zero point per tensor or per column)."""
    acc = np.matmul(_centred(a, a_zero_point, "row"), _centred(b, b_zero_point, "col"))
    y = acc.astype(np.float32) * (_scale(a_scale, "row") * _scale(b_scale, "col"))
    return (y + np.asarray(bias, np.float32) if bias is not None else y).astype(np.float32)


@register("dynamic_quantize_matmul")
def dynamic_quantize_matmul(a, b, b_scale, b_zero_point=None, bias=None, *, activation=None):
    """com.microsoft DynamicQuantizeMatMul: ``a`` quantized as DynamicQuantizeLinear does, then
    MatMulIntegerToFloat with ``b``; ``activation`` "relu" (rpcsrv: a Relu that read the product, folded in)."""
    qa, a_scale, a_zp = dynamic_quantize_linear(a)
    y = matmul_integer_to_float(qa, b, a_scale, b_scale, a_zp, b_zero_point, bias)
    return np.maximum(y, np.float32(0)) if activation == "relu" else y


@register("q_gemm")
def q_gemm(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None, *,
           alpha: float = 1.0, transA: int = 0, transB: int = 0, activation=None, activation_attrs=None):
    """com.microsoft QGemm: ``alpha * a_scale * b_scale * ((a - a_zp) @ (b - b_zp) + c)`` with ``c`` int32
    (zero point 0), quantized to ``y`` (float32 without ``y_scale``).  b per tensor or per column."""
    a, b = np.asarray(a), np.asarray(b)
    ac = _centred(a, a_zero_point, "row")
    ac = ac.T if transA else ac
    bz = np.asarray(b_zero_point).reshape(-1)
    bs = np.asarray(b_scale, np.float32).reshape(-1)
    bc = b.astype(np.int64) - (bz[:, None] if transB and bz.size > 1 else bz if bz.size > 1 else bz[0])
    bc = bc.T if transB else bc
    acc = ac @ bc
    if c is not None:
        acc = acc + np.asarray(c).astype(np.int64)
    mult = (np.float32(alpha) * np.float32(np.asarray(a_scale).reshape(())) * (bs if bs.size > 1 else bs[0]))
    if y_scale is None:
        return (acc.astype(np.float32) * mult.astype(np.float32)).astype(np.float32)
    out = _params(y_scale, y_zero_point, a)
    mult = (mult / np.float32(out.scale)).astype(np.float32)
    return requantize(acc, mult, out.zero_point, clamp_bounds(activation, activation_attrs, out))
