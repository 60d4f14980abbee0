"""Quantized tensors, as the compiler, the codegens and the board all read them.

A quantized tensor holds integers ``q`` standing for the real values ``(q - zero_point) * scale``
(ONNX's linear quantization).  :class:`QuantParams` is that pair, per tensor (one scale) or per
channel (one scale per index of ``axis``), over int8, uint8 or int32 (a bias).  An int8 op of the
language (``ops.py``: ``q_linear_conv``, ``q_gemm``, ``q_linear_add``, ...) takes its operands'
and its result's parameters as inputs, ONNX's way; :data:`QUANT_ROLES` says which inputs those are
for each op, and :func:`roles` reads them as :class:`QuantParams` (what a codegen receives).

The arithmetic every implementation follows (the C kernels, the host C code, the numpy kernels,
a vendor's codegen), and onnxruntime does:

* :func:`quantize`: ``saturate(round_half_to_even(x / scale) + zero_point)``, the division in
  float32 (ONNX QuantizeLinear);
* :func:`dequantize`: ``(q - zero_point) * scale`` in float32;
* :func:`requantize`: an int32 accumulator ``acc`` of products of zero-point-centred integers,
  times the float32 multiplier ``in_scale * w_scale / out_scale`` (per output channel when the
  weights are), rounded half to even, plus the output zero point, saturated to the output type;
* :func:`clamp_bounds`: a fused ``relu``/``clip`` is a clamp of the quantized output to
  ``[quantize(low), quantize(high)]`` (exact: quantization is monotone and 0 maps to the zero point).

The fold of a QDQ chain (``DequantizeLinear`` operands -> a float op [-> Relu/Clip] ->
``QuantizeLinear``) into one int8 op is in ``qdq.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

#: the integer types a quantized tensor may have, and their ranges
QTYPES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255), np.dtype(np.int32): (-2 ** 31, 2 ** 31 - 1)}


@dataclass(frozen=True, eq=False)
class QuantParams:
    """Scale and zero point of a quantized tensor.

    ``scale``: float32, shape ``()`` (per tensor) or ``(C,)`` (per channel along ``axis`` of the
    tensor); ``zero_point``: the quantized type, the shape of ``scale``; ``axis``: the channel axis
    (None per tensor).  Built with :meth:`of` from an op's inputs."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: Optional[int] = None

    @classmethod
    def of(cls, scale: Any, zero_point: Any = None, axis: int = 1, dtype: Any = None) -> "QuantParams":
        """From ONNX inputs: a scalar or 1-D ``scale``, an optional ``zero_point`` (absent: 0 of
        ``dtype``, uint8 by default as in ONNX), and the op's ``axis`` attribute (used per channel)."""
        s = np.asarray(scale, np.float32)
        if zero_point is None:
            z = np.zeros(s.shape, np.dtype(dtype or np.uint8))
        else:
            z = np.asarray(zero_point)
            if z.dtype not in QTYPES:
                raise ValueError(f"a zero point of type {z.dtype} (int8, uint8 or int32 only)")
            if z.size == 1 and s.size > 1:
                z = np.full(s.shape, z.reshape(()), z.dtype)
            if z.shape != s.shape and not (z.size == s.size == 1):
                raise ValueError(f"zero point of shape {z.shape} for a scale of shape {s.shape}")
        if s.ndim > 1 or (s.ndim == 1 and s.size > 1 and axis is None):
            raise ValueError(f"a scale of shape {s.shape}: per tensor (one value) or per channel (1-D) only")
        if s.size == 1:
            return cls(s.reshape(()), z.reshape(()), None)
        return cls(s, z.reshape(s.shape), axis)

    @property
    def dtype(self) -> np.dtype:
        return self.zero_point.dtype

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    @property
    def bounds(self) -> tuple[int, int]:
        return QTYPES[self.dtype]

    def broadcast(self, ndim: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, zero_point)`` shaped to broadcast against a tensor of ``ndim`` dimensions."""
        if self.axis is None:
            return self.scale, self.zero_point
        axis = self.axis % ndim
        shape = [1] * ndim
        shape[axis] = -1
        return self.scale.reshape(shape), self.zero_point.reshape(shape)

    def same_as(self, other: "QuantParams") -> bool:
        """The same real values for the same integers (a pass-through op keeps its input's parameters)."""
        return self.axis == other.axis and self.dtype == other.dtype and self.scale.shape == other.scale.shape \
            and bool(np.all(self.scale == other.scale)) and bool(np.all(self.zero_point == other.zero_point))

    def describe(self) -> str:
        """``int8 scale 0.02 zero point -3`` / ``int8 per channel (axis 0, 64 channels)`` for messages."""
        if self.axis is None:
            return f"{self.dtype} scale {float(self.scale):.6g} zero point {int(self.zero_point)}"
        return f"{self.dtype} per channel (axis {self.axis}, {self.scale.size} channels)"

    def __repr__(self) -> str:
        return f"QuantParams({self.describe()})"


def quantize(x: Any, qp: QuantParams) -> np.ndarray:
    """ONNX QuantizeLinear: ``saturate(round_half_to_even(x / scale) + zero_point)``."""
    x = np.asarray(x, np.float32)
    scale, zp = qp.broadcast(x.ndim)
    lo, hi = qp.bounds
    q = np.rint(x / scale).astype(np.float64) + zp.astype(np.float64)
    return np.clip(q, lo, hi).astype(qp.dtype)


def dequantize(q: Any, qp: QuantParams) -> np.ndarray:
    """ONNX DequantizeLinear: ``(q - zero_point) * scale`` in float32."""
    q = np.asarray(q)
    scale, zp = qp.broadcast(q.ndim)
    return ((q.astype(np.int64) - zp.astype(np.int64)).astype(np.float32) * scale).astype(np.float32)


def multiplier(in_scale: Any, w_scale: Any, out_scale: Any) -> np.ndarray:
    """The float32 requantization multiplier ``in_scale * w_scale / out_scale`` (per channel with ``w``)."""
    return (np.float32(in_scale) * np.asarray(w_scale, np.float32) / np.float32(out_scale)).astype(np.float32)


def requantize(acc: Any, mult: Any, zero_point: Any, bounds: Optional[tuple[int, int]] = None) -> np.ndarray:
    """``saturate(round_half_to_even(acc * mult) + zero_point)``: ``acc`` int32 (or exact integers),
    ``mult`` float32 broadcasting against it, the product in float32 as onnxruntime computes it;
    ``bounds``: a narrower clamp (a fused activation's, :func:`clamp_bounds`)."""
    zp = np.asarray(zero_point)
    lo, hi = bounds if bounds is not None else QTYPES[zp.dtype]
    real = np.asarray(acc).astype(np.float32) * np.asarray(mult, np.float32)
    q = np.rint(real).astype(np.float64) + zp.astype(np.float64)
    return np.clip(q, lo, hi).astype(zp.dtype)


def clamp_bounds(activation: Optional[str], attrs: Optional[Mapping[str, Any]], out: QuantParams) -> tuple[int, int]:
    """The quantized output range of an int8 op with a fused ``activation`` (None: the type's range).
    ``clip``'s ``min``/``max`` attributes (absent: unbounded on that side)."""
    lo, hi = out.bounds
    if activation is None:
        return lo, hi
    attrs = attrs or {}
    if activation == "relu":
        low, high = 0.0, None
    elif activation == "clip":
        low, high = attrs.get("min"), attrs.get("max")
    else:
        raise ValueError(f"activation {activation!r} does not fuse into an int8 op (relu and clip do)")
    if out.per_channel:
        raise ValueError("a fused activation needs a per-tensor output")
    if low is not None:
        lo = max(lo, int(quantize(np.float32(low), out)))
    if high is not None:
        hi = min(hi, int(quantize(np.float32(high), out)))
    return lo, hi


#: per int8 op: each quantized tensor's role -> (its input or None for the result, scale input, zero-point input,
#: channel axis of a per-channel scale: an int, ``"axis"`` (the op's attribute) or ``"gemm_b"`` (by transB)),
#: by input position; ``q_linear_concat``'s inputs are (x, x_scale, x_zero_point) triples after its two
QUANT_ROLES: dict[str, dict[str, tuple]] = {
    "q_linear_conv": {"x": (0, 1, 2, None), "w": (3, 4, 5, 0), "y": (None, 6, 7, None)},
    "q_linear_matmul": {"a": (0, 1, 2, -2), "b": (3, 4, 5, -1), "y": (None, 6, 7, None)},
    "q_gemm": {"a": (0, 1, 2, None), "b": (3, 4, 5, "gemm_b"), "y": (None, 7, 8, None)},
    "q_linear_add": {"a": (0, 1, 2, None), "b": (3, 4, 5, None), "y": (None, 6, 7, None)},
    "q_linear_mul": {"a": (0, 1, 2, None), "b": (3, 4, 5, None), "y": (None, 6, 7, None)},
    "q_linear_concat": {"y": (None, 0, 1, None)},
    "q_linear_global_average_pool": {"x": (0, 1, 2, None), "y": (None, 3, 4, None)},
    "q_linear_average_pool": {"x": (0, 1, 2, None), "y": (None, 3, 4, None)},
    "q_linear_sigmoid": {"x": (0, 1, 2, None), "y": (None, 3, 4, None)},
    "q_linear_leaky_relu": {"x": (0, 1, 2, None), "y": (None, 3, 4, None)},
    "q_linear_softmax": {"x": (0, 1, 2, None), "y": (None, 3, 4, None)},
    "quantize_linear": {"y": (None, 1, 2, "axis")},
    "dequantize_linear": {"x": (0, 1, 2, "axis")},
    "dynamic_quantize_matmul": {"b": (1, 2, 3, -1)},
    "matmul_integer_to_float": {"a": (0, 2, 4, -1), "b": (1, 3, 5, -1)},
}


def role_slots(op: str, count: int) -> dict[str, tuple]:
    """``QUANT_ROLES[op]`` for a use of ``op`` with ``count`` inputs: ``q_linear_concat``'s ``x0``, ``x1``, ...
    added ({} for an op without quantized roles)."""
    slots = dict(QUANT_ROLES.get(op, {}))
    if op == "q_linear_concat":
        for k in range((count - 2) // 3):
            slots[f"x{k}"] = (2 + 3 * k, 3 + 3 * k, 4 + 3 * k, None)
    return slots


def roles(op: str, inputs: Sequence[Any], attrs: Mapping[str, Any], value: Callable[[Any], Any],
          dtype: Callable[[Any], Any] = lambda _ref: None) -> dict[str, QuantParams]:
    """The quantization parameters of an int8 op's operands and result, by role (``x``, ``w``, ``y``,
    ...; ``x0``, ``x1``, ... for ``q_linear_concat``'s inputs).  ``inputs``: the op's input references
    (names, IDs; falsy: absent); ``value(ref)``: a constant's array, None when the input is not constant
    (its role is then left out); ``dtype(ref)``: a quantized input's dtype, for a zero point left out
    (absent, ONNX's default: uint8)."""
    slots = role_slots(op, len(inputs))
    present = lambda k: k is not None and k < len(inputs) and bool(inputs[k])  # noqa: E731
    out: dict[str, QuantParams] = {}
    for role, (di, si, zi, axis) in slots.items():
        if not present(si):
            continue
        scale = value(inputs[si])
        zp = value(inputs[zi]) if present(zi) else None
        if scale is None or (present(zi) and zp is None):
            continue  # computed at run time: not known before
        if axis == "axis":
            axis = int(attrs.get("axis", 1))
        elif axis == "gemm_b":
            axis = 0 if attrs.get("transB", 0) else 1
        out[role] = QuantParams.of(scale, zp, axis, dtype(inputs[di]) if zp is None and present(di) else None)
    return out
