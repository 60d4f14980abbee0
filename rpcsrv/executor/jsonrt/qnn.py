"""Quantized ops of JSON-runtime graphs: relay's QNN ops as TVM's backends serialize them, with TVM's arithmetic.

Arm Compute Library's serializer (TVM v0.19.0 ``src/relay/backend/contrib/arm_compute_lib/codegen.cc``) writes
its ``arm_compute_lib.qnn_conv2d`` and ``arm_compute_lib.qnn_dense`` composites (qnn op, optional bias,
optional relu, ``qnn.requantize``) as one node, read by its runtime (``acl_runtime.cc``) by position:

* ``qnn.conv2d`` / ``qnn.depthwise_conv2d``: data (uint8/int8, NHWC), kernel (OHWI; IHWO depthwise), input zero
  point, kernel zero point, input scale, kernel scale, [int32 bias], output scale, output zero point; the
  conv's attributes, ``activation_type`` relu when the composite has one; the output is the requantize's
  (uint8/int8, ``out_dtype`` the conv's int32);
* ``qnn.dense``: data, weight ``(units, in)``, the same parameters, [bias];
* ``qnn.add`` (a plain op ACL takes): lhs, rhs, lhs scale, lhs zero point, rhs scale, rhs zero point, output
  scale, output zero point.

What TVM computes for them (its QNN lowering, ``src/relay/qnn/op/{convolution,dense,add,requantize}.cc``):
the int32 sum of ``(x - x_zp) * (w - w_zp)`` (padding with the input zero point, so centred zeros), plus the
bias, ``relu`` on that accumulator, then ``qnn.requantize`` with the input scale ``x_scale * w_scale``
(float32) and zero point 0: :func:`requantize` (TVM's integer lowering: the multiplier
``in_scale / out_scale`` as a 31-bit fixed-point significand and a shift, ``GetFixedPointMultiplierShift``;
the product rounded half up, ``FixedPointMultiply``'s "UPWARD" rounding, TVM's default), plus the output
zero point, saturated to the output type.  ``qnn.add`` requantizes each operand to the output's parameters
(where they differ) and adds, ``a' + b' - zp``, saturated.  Per-tensor parameters only (ACL offloads no
per-channel QNN op).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import KERNELS
from .attrs import Attrs, OpError, permute, spatial, spatial_pads, weight_to_first
from .nn import Prepared, _layouts


def fixed_point(multiplier: float) -> tuple[int, int]:
    """TVM's ``GetFixedPointMultiplierShift``: ``multiplier = significand / 2**31 * 2**shift``."""
    if multiplier == 0.0:
        return 0, 0
    mantissa, shift = math.frexp(multiplier)
    significand = math.floor(mantissa * (1 << 31) + 0.5)  # half away from zero (std::round), mantissa > 0
    if significand == 1 << 31:
        significand, shift = significand // 2, shift + 1
    return int(significand), int(shift)


def fixed_point_multiply(x: np.ndarray, multiplier: float) -> np.ndarray:
    """TVM's ``FixedPointMultiply`` of int32 ``x``: ``(x << left) * significand``, plus half, shifted right
    by ``31 + right`` (rounding half up), in int64."""
    significand, shift = fixed_point(multiplier)
    left, right = max(shift, 0), max(-shift, 0)
    wide = np.asarray(x, np.int64) << left
    total = 31 + right
    return ((wide * significand + (1 << (total - 1))) >> total).astype(np.int64)


def requantize(acc: np.ndarray, in_scale, in_zp, out_scale, out_zp, dtype=None) -> np.ndarray:
    """``qnn.requantize`` lowered as TVM lowers it (module doc); saturated to ``dtype`` (None: int32, unclipped)."""
    in_scale, out_scale = np.float32(np.asarray(in_scale).reshape(())), np.float32(np.asarray(out_scale).reshape(()))
    x = np.asarray(acc, np.int64) - int(np.asarray(in_zp).reshape(()))
    if in_scale != out_scale:
        x = fixed_point_multiply(x, float(in_scale) / float(out_scale))
    x = x + int(np.asarray(out_zp).reshape(()))
    if dtype is None:
        return x
    info = np.iinfo(dtype)
    return np.clip(x, info.min, info.max).astype(dtype)


def _per_tensor(shapes, positions, where: str) -> None:
    for k in positions:
        if k < len(shapes) and int(np.prod(shapes[k])) != 1:
            raise OpError(f"{where}: per-channel quantization parameters (input {k}, shape {list(shapes[k])}) "
                          "are not supported (per tensor only)")


def _quant_types(node) -> np.dtype:
    out = np.dtype(node.dtypes[0])
    if out not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise OpError(f"a quantized op's output is int8 or uint8, not {out}")
    return out


def _out_dtype(a: Attrs) -> None:
    want = a.str("out_dtype", None)
    if want not in (None, "int32"):
        raise OpError(f"out_dtype {want} (the accumulator of a qnn op is int32)")


def conv(node, a: Attrs, shapes) -> Prepared:
    """qnn.conv2d / qnn.depthwise_conv2d with ACL's inputs (module doc), any plain layout."""
    if len(node.inputs) not in (8, 9):
        raise OpError(f"takes 8 inputs, or 9 with a bias, got {len(node.inputs)}")
    bias = len(node.inputs) == 9
    _per_tensor(shapes, (2, 3, 4, 5, 6 + bias, 7 + bias), "qnn conv")
    data, xperm, back, k = _layouts(a, len(shapes[0]))
    spatial_axes = "".join(c for c in data if c not in "NC")
    wperm = weight_to_first(a.str("kernel_layout", "OI" + spatial_axes), data, "OI")
    groups = a.int("groups", 1)
    attrs = dict(group=groups, pads=spatial_pads(a.ints("padding", [0]), k), strides=spatial(a, "strides", k, 1),
                 dilations=spatial(a, "dilation", k, 1))
    _out_dtype(a)
    act = a.str("activation_type", None)
    if act not in (None, "none", "relu"):
        raise OpError(f"fused activation {act!r} on a qnn conv is not supported (relu)")
    dtype = _quant_types(node)
    fn = KERNELS["conv_integer"]

    def run(x, w, x_zp, w_zp, x_scale, w_scale, *rest):
        b, (y_scale, y_zp) = (rest[0], rest[1:]) if bias else (None, rest)
        acc = fn(permute(x, xperm), w, x_zp.reshape(()), w_zp.reshape(()), **attrs).astype(np.int64)
        if b is not None:
            acc = acc + np.asarray(b, np.int64).reshape((1, -1) + (1,) * k)
        if act == "relu":
            acc = np.maximum(acc, 0)
        in_scale = np.float32(x_scale.reshape(())) * np.float32(w_scale.reshape(()))
        return permute(requantize(acc, in_scale, 0, y_scale, y_zp, dtype), back)

    return Prepared(run, {1: (lambda w: permute(w, wperm))} if wperm else {})


def dense(node, a: Attrs, shapes) -> Prepared:
    """qnn.dense (weight ``(units, in)``) with ACL's inputs, [bias]."""
    if len(node.inputs) not in (8, 9):
        raise OpError(f"takes 8 inputs, or 9 with a bias, got {len(node.inputs)}")
    bias = len(node.inputs) == 9
    _per_tensor(shapes, (2, 3, 4, 5, 6 + bias, 7 + bias), "qnn.dense")
    _out_dtype(a)
    dtype = _quant_types(node)
    fn = KERNELS["matmul_integer"]

    def run(x, wt, x_zp, w_zp, x_scale, w_scale, *rest):
        b, (y_scale, y_zp) = (rest[0], rest[1:]) if bias else (None, rest)
        acc = fn(x, wt, x_zp.reshape(()), w_zp.reshape(())).astype(np.int64)
        if b is not None:
            acc = acc + np.asarray(b, np.int64).reshape(-1)
        in_scale = np.float32(x_scale.reshape(())) * np.float32(w_scale.reshape(()))
        return requantize(acc, in_scale, 0, y_scale, y_zp, dtype)

    return Prepared(run, {1: lambda w: np.ascontiguousarray(w.T)})


def add(node, a: Attrs, shapes) -> Prepared:
    """qnn.add: each operand requantized to the output's parameters where they differ, summed (module doc)."""
    if len(node.inputs) != 8:
        raise OpError(f"takes 8 inputs (lhs, rhs, then scale and zero point of each and of the output), got "
                      f"{len(node.inputs)}")
    _per_tensor(shapes, range(2, 8), "qnn.add")
    dtype = _quant_types(node)

    def side(q, scale, zp, out_scale, out_zp):
        if np.float32(scale.reshape(())) == np.float32(out_scale.reshape(())) and \
                int(zp.reshape(())) == int(out_zp.reshape(())):
            return np.asarray(q, np.int64)
        return requantize(q, scale, zp, out_scale, out_zp)

    def run(lhs, rhs, ls, lz, rs, rz, os_, oz):
        total = side(lhs, ls, lz, os_, oz) + side(rhs, rs, rz, os_, oz) - int(oz.reshape(()))
        info = np.iinfo(dtype)
        return np.clip(total, info.min, info.max).astype(dtype)

    return Prepared(run)


#: the QNN ops by the names the serializers write (ACL's pattern names are accepted too, as for its float ones)
QNN_OPS = {"qnn.conv2d": conv, "qnn.depthwise_conv2d": conv, "qnn.dense": dense, "qnn.add": add}
QNN_COMPOSITES = {"arm_compute_lib.qnn_conv2d": conv, "arm_compute_lib.qnn_dense": dense}
