"""Elementwise binary and variadic ops with numpy (multidirectional) broadcasting.

ONNX semantics that differ from plain numpy operators:

* ``div`` on integers truncates toward zero (C semantics), numpy's ``//`` floors;
* ``mod`` follows ``fmod=0`` (sign of the divisor, Python style) or ``fmod=1`` (sign of the dividend);
* ``pow`` keeps the dtype of the base;
* comparisons give ``bool``; ``and``/``or``/``xor`` take bools;
* ``bit_shift`` direction is an attribute.
"""

from __future__ import annotations

import numpy as np

from .registry import bad, register


def _same_dtype(op: str, a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise bad(op, f"input dtypes differ: {a.dtype} and {b.dtype}")


def _arith(name: str, ufunc):
    @register(name)
    def kernel(a, b):
        a, b = np.asarray(a), np.asarray(b)
        _same_dtype(name, a, b)
        return ufunc(a, b).astype(a.dtype, copy=False)

    kernel.__doc__ = f"ONNX {name}: elementwise, broadcasting, result in the input dtype."
    return kernel


_arith("add", np.add)
_arith("sub", np.subtract)
_arith("mul", np.multiply)


@register("div")
def div(a, b):
    """ONNX Div: true division on floats, truncation toward zero on integers."""
    a, b = np.asarray(a), np.asarray(b)
    _same_dtype("div", a, b)
    if a.dtype.kind in "iu":
        if np.any(b == 0):
            raise bad("div", "integer division by zero")
        q = np.floor_divide(a, b)
        # numpy floors; ONNX (like C) truncates: step back toward zero where the signs differ
        return q + ((q < 0) & (q * b != a)).astype(a.dtype)
    return np.divide(a, b).astype(a.dtype, copy=False)
