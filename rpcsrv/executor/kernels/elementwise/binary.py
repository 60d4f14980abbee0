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

from ..registry import apply_activation, bad, register


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


@register("add")
def add(a, b, *, activation=None, activation_attrs=None):
    """ONNX Add: elementwise, broadcasting, result in the input dtype; ``activation``: the Add+Relu
    composite (a residual connection), applied in place on the new sum."""
    a, b = np.asarray(a), np.asarray(b)
    _same_dtype("add", a, b)
    y = np.add(a, b)
    if activation is not None and not isinstance(y, np.ndarray):
        y = np.asarray(y)  # (a 0-d sum is a numpy scalar)
    return apply_activation(y, activation, activation_attrs, "add")


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


@register("pow")
def pow_(x, y):
    """ONNX Pow: result has the base's dtype (the exponent may be another numeric type)."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind in "iu" and y.dtype.kind in "iu":
        if np.any(y < 0):
            raise bad("pow", "negative integer exponent")
        return np.power(x, y.astype(x.dtype)).astype(x.dtype, copy=False)
    ct = np.float32 if x.dtype == np.float16 else np.result_type(x.dtype, y.dtype, np.float32)
    return np.power(x.astype(ct, copy=False), y.astype(ct, copy=False)).astype(x.dtype)


@register("mod")
def mod(a, b, *, fmod: int = 0):
    """ONNX Mod: ``fmod=0`` takes the divisor's sign (Python style), ``fmod=1`` the dividend's (C fmod)."""
    a, b = np.asarray(a), np.asarray(b)
    _same_dtype("mod", a, b)
    with np.errstate(invalid="ignore", divide="ignore"):  # x mod 0 and inf mod y are NaN, as in ONNX
        y = np.fmod(a, b) if fmod else np.mod(a, b)
    return y.astype(a.dtype, copy=False)


def _simple(name: str, ufunc, doc: str):
    @register(name)
    def kernel(a, b):
        return ufunc(np.asarray(a), np.asarray(b))

    kernel.__doc__ = doc


for _name, _ufunc in {"equal": np.equal, "less": np.less, "greater": np.greater,
                      "less_or_equal": np.less_equal, "greater_or_equal": np.greater_equal}.items():
    _simple(_name, _ufunc, f"ONNX {_name}: elementwise comparison with broadcasting, bool result.")
for _name, _ufunc in {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}.items():
    _simple(_name, _ufunc, f"ONNX {_name}: elementwise logic on bools with broadcasting.")
for _name, _ufunc in {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                      "bitwise_xor": np.bitwise_xor}.items():
    _simple(_name, _ufunc, f"ONNX {_name}: elementwise on integers with broadcasting.")


@register("bitwise_not")
def bitwise_not(x):
    """ONNX BitwiseNot."""
    return np.invert(np.asarray(x))


@register("bit_shift")
def bit_shift(x, y, *, direction: str):
    """ONNX BitShift on unsigned integers, ``direction`` 'LEFT' or 'RIGHT' (bits shifted out are lost)."""
    x, y = np.asarray(x), np.asarray(y)
    if direction == "LEFT":
        return np.left_shift(x, y).astype(x.dtype, copy=False)
    if direction == "RIGHT":
        return np.right_shift(x, y).astype(x.dtype, copy=False)
    raise bad("bit_shift", f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")


def _reduce_inputs(name: str, ufunc, xs, mean: bool = False) -> np.ndarray:
    if not xs or any(x is None for x in xs):
        raise bad(name, "needs at least one input and no absent ones")
    arrays = [np.asarray(x) for x in xs]
    out = arrays[0]
    for x in arrays[1:]:
        _same_dtype(name, out, x)
        out = ufunc(out, x)
    if mean:
        out = out / len(arrays)
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if out.shape != shape or not isinstance(out, np.ndarray):  # (ufuncs of 0-d arrays give scalars)
        out = np.broadcast_to(out, shape)
    return out.astype(arrays[0].dtype, copy=False)


def _variadic(name: str, ufunc, mean: bool = False):
    @register(name)
    def kernel(*xs):
        return _reduce_inputs(name, ufunc, xs, mean)

    kernel.__doc__ = f"ONNX {name}: elementwise over any number of broadcast inputs."


_variadic("max", np.maximum)
_variadic("min", np.minimum)
_variadic("mean", np.add, mean=True)


@register("sum")
def sum_(*xs, activation=None, activation_attrs=None):
    """ONNX Sum: elementwise over any number of broadcast inputs; ``activation``: the Sum+Relu composite
    (old exports' residual connection)."""
    y = _reduce_inputs("sum", np.add, xs)
    if activation is not None and (len(xs) < 2 or not y.flags.owndata):
        y = np.array(y)  # a view of an input (one input, or a broadcast): the activation needs its own buffer
    return apply_activation(y, activation, activation_attrs, "sum")


@register("where")
def where(condition, x, y):
    """ONNX Where: pick ``x`` where ``condition`` holds, else ``y`` (all three broadcast)."""
    x, y = np.asarray(x), np.asarray(y)
    _same_dtype("where", x, y)
    return np.where(np.asarray(condition, dtype=bool), x, y)


@register("prelu")
def prelu(x, slope):
    """ONNX PRelu: x, or slope*x below zero; ``slope`` broadcasts to ``x`` (unidirectionally)."""
    x, slope = np.asarray(x), np.asarray(slope)
    return np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)
