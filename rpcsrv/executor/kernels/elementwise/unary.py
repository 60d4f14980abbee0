"""Elementwise unary ops and activations.

Float16 inputs are computed in float32 where numpy's float16 transcendental functions would lose
accuracy, and cast back, so the output dtype always equals the input dtype (except ``not``, ``is_nan``
and ``is_inf``, which give ``bool``, and ``cast``).  ``erf`` uses a rational approximation (absolute
error below 1.2e-7, as good as float32 holds), since numpy has no erf and the board has no scipy.
"""

from __future__ import annotations

import numpy as np

from ..clib import compiled
from ..onnx_dtypes import onnx_dtype
from ..registry import bad, register, relu


def _float_op(name: str, fn, doc: str):
    @register(name)
    def kernel(x):
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise bad(name, f"needs a floating-point input, got {x.dtype}")
        with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf, sqrt(-1) = nan, as in ONNX
            if x.dtype == np.float16:
                return fn(x.astype(np.float32)).astype(np.float16)
            return fn(x).astype(x.dtype, copy=False)

    kernel.__doc__ = doc
    return kernel


def _any_op(name: str, fn, doc: str):
    @register(name)
    def kernel(x):
        x = np.asarray(x)
        return fn(x).astype(x.dtype, copy=False)

    kernel.__doc__ = doc
    return kernel


def erf_approx(x: np.ndarray) -> np.ndarray:
    """erf(x) by Abramowitz & Stegun 7.1.28-class rational fit (7.1.26), |error| < 1.5e-7."""
    a = np.abs(x)
    t = a * 0.3275911  # t = 1 / (1 + p|x|), then Horner's rule, all in place on one temporary
    t += 1.0
    np.reciprocal(t, out=t)
    y = t * 1.061405429
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        y += c
        y *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    y *= a
    np.subtract(1.0, y, out=y)
    return np.copysign(y, x, out=y)


def _sigmoid(x):
    """1 / (1 + exp(-x)): float32 by the compiled kernel when there is one (one pass, ``compiled.sigmoid``:
    3x faster), else in place on one temporary.  Accurate to a few ulp everywhere (below -88 exp
    overflows to inf and the result is 0, its limit); splitting by sign (exp(-|x|) and a select) was
    12x slower (11.7 against 0.96 ms on 96x112x112 float32): EfficientNet spent 25 ms per run here."""
    y = compiled.sigmoid(x)
    if y is not None:
        return y
    t = np.negative(x)
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += 1
    return np.reciprocal(t, out=t)


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


for _name, _fn in {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "reciprocal": np.reciprocal,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "tanh": np.tanh, "floor": np.floor, "ceil": np.ceil,
    "round": np.round,  # numpy rounds half to even, as ONNX Round does
    "erf": erf_approx, "sigmoid": _sigmoid, "softplus": _softplus,
    "softsign": lambda x: x / (1 + np.abs(x)),
    "mish": lambda x: x * np.tanh(_softplus(x)),
}.items():
    _float_op(_name, _fn, f"ONNX {_name}: elementwise on floats.")

for _name, _fn in {"abs": np.abs, "neg": np.negative, "sign": np.sign, "relu": relu,
                   "identity": lambda x: x}.items():
    _any_op(_name, _fn, f"ONNX {_name}: elementwise, any numeric dtype.")


@register("not")
def not_(x):
    """ONNX Not: logical negation of a bool tensor."""
    return np.logical_not(x)


@register("is_nan")
def is_nan(x):
    """ONNX IsNaN."""
    return np.isnan(x)


@register("is_inf")
def is_inf(x, *, detect_negative: int = 1, detect_positive: int = 1):
    """ONNX IsInf, optionally only one sign."""
    x = np.asarray(x)
    return np.isinf(x) & (((x > 0) & bool(detect_positive)) | ((x < 0) & bool(detect_negative)))


def _floats(x, name):
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise bad(name, f"needs a floating-point input, got {x.dtype}")
    return x, (np.float32 if x.dtype == np.float16 else x.dtype)


@register("leaky_relu")
def leaky_relu(x, *, alpha: float = 0.01):
    """ONNX LeakyRelu: x, or alpha*x below zero."""
    x, _ = _floats(x, "leaky_relu")
    return np.where(x < 0, x * x.dtype.type(alpha), x)


@register("elu")
def elu(x, *, alpha: float = 1.0):
    """ONNX Elu: alpha*(exp(x)-1) below zero."""
    x, ct = _floats(x, "elu")
    xc = x.astype(ct, copy=False)
    return np.where(xc < 0, alpha * np.expm1(np.minimum(xc, 0)), xc).astype(x.dtype, copy=False)


@register("celu")
def celu(x, *, alpha: float = 1.0):
    """ONNX Celu: max(0,x) + min(0, alpha*(exp(x/alpha)-1))."""
    x, ct = _floats(x, "celu")
    xc = x.astype(ct, copy=False)
    y = np.maximum(xc, 0) + np.minimum(0, alpha * np.expm1(np.minimum(xc, 0) / alpha))
    return y.astype(x.dtype, copy=False)


@register("selu")
def selu(x, *, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875):
    """ONNX Selu: gamma * (x if x > 0 else alpha*(exp(x)-1))."""
    x, ct = _floats(x, "selu")
    xc = x.astype(ct, copy=False)
    y = gamma * np.where(xc > 0, xc, alpha * np.expm1(np.minimum(xc, 0)))
    return y.astype(x.dtype, copy=False)


@register("thresholded_relu")
def thresholded_relu(x, *, alpha: float = 1.0):
    """ONNX ThresholdedRelu: x where x > alpha, else 0."""
    x, _ = _floats(x, "thresholded_relu")
    return np.where(x > alpha, x, x.dtype.type(0))


@register("hard_sigmoid")
def hard_sigmoid(x, *, alpha: float = 0.2, beta: float = 0.5):
    """ONNX HardSigmoid: clip(alpha*x + beta, 0, 1)."""
    x, _ = _floats(x, "hard_sigmoid")
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype, copy=False)


@register("hard_swish")
def hard_swish(x):
    """ONNX HardSwish: x * clip(x/6 + 1/2, 0, 1)."""
    x, _ = _floats(x, "hard_swish")
    return (x * np.clip(x * x.dtype.type(1 / 6) + x.dtype.type(0.5), 0, 1)).astype(x.dtype, copy=False)


@register("shrink")
def shrink(x, *, bias: float = 0.0, lambd: float = 0.5):
    """ONNX Shrink: x+bias below -lambd, x-bias above lambd, else 0."""
    x = np.asarray(x)
    y = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    return y.astype(x.dtype, copy=False)


@register("swish")
def swish(x, *, alpha: float = 1.0):
    """ONNX Swish: x * sigmoid(alpha * x)."""
    x, ct = _floats(x, "swish")
    y = compiled.sigmoid(x, times_x=True) if alpha == 1.0 else None  # SiLU in one pass
    if y is not None:
        return y
    xc = x.astype(ct, copy=False)
    return (xc * _sigmoid(xc * np.dtype(ct).type(alpha))).astype(x.dtype, copy=False)


@register("gelu")
def gelu(x, *, approximate: str = "none"):
    """ONNX Gelu: x*Phi(x) with the exact erf form, or the tanh form for approximate='tanh'."""
    x, ct = _floats(x, "gelu")
    ct = np.dtype(ct)
    xc = x.astype(ct, copy=False)
    if approximate == "none":
        y = erf_approx(xc * ct.type(0.7071067811865476))
        y += 1.0
        y *= xc
        y *= ct.type(0.5)
    elif approximate == "tanh":
        y = 0.5 * xc * (1.0 + np.tanh(ct.type(0.7978845608028654) * (xc + ct.type(0.044715) * xc ** 3)))
    else:
        raise bad("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return y.astype(x.dtype, copy=False)


@register("clip")
def clip(x, lo=None, hi=None, *, min=None, max=None):  # noqa: A002 - ONNX attribute names
    """ONNX Clip: bounds as inputs (opset >= 11) or as ``min``/``max`` attributes (opset 6)."""
    x = np.asarray(x)
    lo = min if lo is None else lo
    hi = max if hi is None else hi
    if lo is None and hi is None:
        return x
    lo = None if lo is None else np.asarray(lo, dtype=x.dtype)
    hi = None if hi is None else np.asarray(hi, dtype=x.dtype)
    return np.clip(x, lo, hi).astype(x.dtype, copy=False)


@register("cast")
def cast(x, *, to, saturate: int = 1, round_mode: str = "up"):
    """ONNX Cast to ``to`` (a TensorProto dtype number, or a TVM dtype string such as 'float16').

    ``saturate`` and ``round_mode`` only concern float8/float4 targets, which numpy does not have;
    they are accepted and ignored.  Float to integer casts truncate toward zero (as C and ONNX do).
    """
    x = np.asarray(x)
    target = onnx_dtype(to, "cast")
    if x.dtype == target:
        return x
    return x.astype(target)


@register("cast_like")
def cast_like(x, target_type, *, saturate: int = 1, round_mode: str = "up"):
    """ONNX CastLike: cast ``x`` to the dtype of ``target_type`` (float8 options ignored)."""
    return np.asarray(x).astype(np.asarray(target_type).dtype, copy=False)
