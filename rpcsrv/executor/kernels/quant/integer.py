"""Integer and quantized linear algebra: MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

Integer products accumulate exactly in int32 (int64 internally, then cast, so no intermediate
overflow).  The QLinear ops requantize as ONNX specifies: the exact integer accumulator times
``a_scale * b_scale / y_scale``, rounded half to even, plus the output zero point, saturated.
"""

from __future__ import annotations

import numpy as np

from ....loader.opset.quant import QuantParams, clamp_bounds
from ..conv.conv import conv
from ..registry import register


def _per(param, where: str, rank: int = 0) -> np.ndarray:
    """A quantization parameter as float64: scalar, per row (``"row"``: a column vector),
    per column (``"col"``) or per output channel (``"chan"``, shape (M, 1, ...) for ``rank`` dims)."""
    p = np.asarray(param, np.float64)
    if p.size == 1:
        return p.reshape(())
    if where == "none":
        raise ValueError(f"a per-tensor quantization parameter must have one element, got shape {p.shape}")
    return p.reshape({"row": (-1, 1), "col": (1, -1), "chan": (-1,) + (1,) * rank}[where])


@register("matmul_integer")
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """ONNX MatMulInteger: (a - a_zp) @ (b - b_zp) as int32 (a_zp per row, b_zp per column)."""
    a_c = np.asarray(a).astype(np.int64)
    b_c = np.asarray(b).astype(np.int64)
    if a_zero_point is not None:
        a_c = a_c - _per(a_zero_point, "row").astype(np.int64)
    if b_zero_point is not None:
        b_c = b_c - _per(b_zero_point, "col").astype(np.int64)
    return np.matmul(a_c, b_c).astype(np.int32)


@register("conv_integer")
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad: str = "NOTSET", dilations=None,
                 group: int = 1, kernel_shape=None, pads=None, strides=None):
    """ONNX ConvInteger: conv of the zero-point-centred integers, exact, as int32.

    Padding is with the zero point (so centred zeros), as ONNX requires.
    """
    k = np.ndim(w) - 2
    xc = np.asarray(x).astype(np.float64)
    wc = np.asarray(w).astype(np.float64)
    if x_zero_point is not None:
        xc = xc - _per(x_zero_point, "none")
    if w_zero_point is not None:
        wc = wc - _per(w_zero_point, "chan", k + 1)
    y = conv(xc, wc, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
             pads=pads, strides=strides)
    return np.rint(y).astype(np.int32)  # float64 holds these sums exactly (< 2**53)


def _requantize(acc, scale, y_scale, y_zero_point, activation=None, activation_attrs=None):
    """saturate(round_half_even(acc * scale / y_scale) + y_zero_point) in the zero point's type, clamped to a
    fused activation's range (``rpcsrv.loader.opset.quant.clamp_bounds``); the product in float64, exact
    where onnxruntime's float32 one may differ by a step on rare elements."""
    y_zp = np.asarray(y_zero_point)
    q = np.rint(acc * (scale / _per(y_scale, "none"))) + y_zp.astype(np.float64)
    lo, hi = clamp_bounds(activation, activation_attrs, QuantParams.of(y_scale, y_zp))
    return np.clip(q, lo, hi).astype(y_zp.dtype)


@register("q_linear_matmul")
def q_linear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *,
                    activation=None, activation_attrs=None):
    """ONNX QLinearMatMul with per-tensor or per-row (a) / per-column (b) quantization parameters; a fused
    ``relu``/``clip`` clamps the output."""
    a_c = np.asarray(a).astype(np.float64) - _per(a_zero_point, "row")
    b_c = np.asarray(b).astype(np.float64) - _per(b_zero_point, "col")
    acc = np.matmul(a_c, b_c)  # exact: integer sums far below 2**53
    return _requantize(acc, _per(a_scale, "row") * _per(b_scale, "col"), y_scale, y_zero_point, activation,
                       activation_attrs)


@register("q_linear_conv")
def q_linear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *,
                  auto_pad: str = "NOTSET", dilations=None, group: int = 1, kernel_shape=None, pads=None,
                  strides=None, activation=None, activation_attrs=None):
    """ONNX QLinearConv: per-tensor x, per-tensor or per-output-channel w, int32 bias B; a fused
    ``relu``/``clip`` clamps the output."""
    k = np.ndim(w) - 2
    xc = np.asarray(x).astype(np.float64) - _per(x_zero_point, "none")
    wc = np.asarray(w).astype(np.float64) - _per(w_zero_point, "chan", k + 1)
    acc = conv(xc, wc, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
               pads=pads, strides=strides)
    if b is not None:
        acc = acc + np.asarray(b, np.float64).reshape((-1,) + (1,) * k)
    scale = _per(x_scale, "none") * _per(w_scale, "chan", k)
    return _requantize(np.rint(acc), scale, y_scale, y_zero_point, activation, activation_attrs)
