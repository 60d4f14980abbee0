"""Element-wise kernels: arithmetic with numpy broadcasting, comparisons, logic, activations."""

from __future__ import annotations

import numpy as np

from . import register

# --------------------------------------------------------------------------- binary arithmetic


def _same_dtype(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    return out.astype(a.dtype, copy=False)


@register("add")
def add(a, b):
    return _same_dtype(a, np.add(a, b))


@register("sub")
def sub(a, b):
    return _same_dtype(a, np.subtract(a, b))


@register("mul")
def mul(a, b):
    return _same_dtype(a, np.multiply(a, b))


@register("div")
def div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return _same_dtype(a, np.trunc(np.divide(a, b)))  # ONNX integer division truncates
    return _same_dtype(a, np.divide(a, b))


@register("pow")
def pow_(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return _same_dtype(a, np.power(a.astype(np.float64), b))
    return _same_dtype(a, np.power(a, b.astype(a.dtype) if np.issubdtype(b.dtype, np.floating) else b))


@register("mod")
def mod(a, b, fmod=0):
    if fmod:
        return _same_dtype(a, np.fmod(a, b))
    return _same_dtype(a, np.mod(a, b))


def _variadic(fn):
    def kernel(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return _same_dtype(xs[0], out)
    return kernel


register("max")(_variadic(np.maximum))
register("min")(_variadic(np.minimum))
register("sum")(_variadic(np.add))


@register("mean")
def mean(*xs):
    return _same_dtype(xs[0], _variadic(np.add)(*xs) / len(xs))


# --------------------------------------------------------------------------- comparisons and logic
for _name, _fn in [("equal", np.equal), ("less", np.less), ("greater", np.greater),
                   ("less_or_equal", np.less_equal), ("greater_or_equal", np.greater_equal),
                   ("and", np.logical_and), ("or", np.logical_or), ("xor", np.logical_xor)]:
    register(_name)(lambda a, b, _f=_fn: _f(a, b))


@register("not")
def not_(a):
    return np.logical_not(a)


@register("where")
def where(cond, a, b):
    return np.where(cond, a, b).astype(np.result_type(a, b), copy=False)


# --------------------------------------------------------------------------- unary math


def _unary(fn):
    return lambda x: _same_dtype(x, fn(x))


for _name, _fn in [("abs", np.abs), ("neg", np.negative), ("exp", np.exp), ("log", np.log),
                   ("sqrt", np.sqrt), ("floor", np.floor), ("ceil", np.ceil), ("round", np.round),
                   ("sign", np.sign), ("sin", np.sin), ("cos", np.cos), ("tan", np.tan),
                   ("asin", np.arcsin), ("acos", np.arccos), ("atan", np.arctan), ("sinh", np.sinh),
                   ("cosh", np.cosh), ("asinh", np.arcsinh), ("acosh", np.arccosh),
                   ("atanh", np.arctanh), ("tanh", np.tanh)]:
    register(_name)(_unary(_fn))


@register("reciprocal")
def reciprocal(x):
    return _same_dtype(x, np.reciprocal(x))


@register("identity")
def identity(x):
    return x


@register("dropout")
def dropout(x, ratio=None, training_mode=None, seed=None):
    """Inference: the input unchanged (ONNX's mask output is not supported)."""
    return x


@register("cast")
def cast(x, to, saturate=1):
    from onnx import helper

    return x.astype(helper.tensor_dtype_to_np_dtype(to))


@register("cast_like")
def cast_like(x, like, saturate=1):
    return x.astype(like.dtype)


@register("is_nan")
def is_nan(x):
    return np.isnan(x)


@register("is_inf")
def is_inf(x, detect_negative=1, detect_positive=1):
    return (np.isposinf(x) & bool(detect_positive)) | (np.isneginf(x) & bool(detect_negative))


# --------------------------------------------------------------------------- activations


def _erf(x: np.ndarray) -> np.ndarray:
    """erf by Abramowitz & Stegun 7.1.26 refined with one Newton step (|error| < 1e-9 in float64)."""
    x64 = np.asarray(x, dtype=np.float64)
    s = np.sign(x64)
    a = np.abs(x64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-a * a)
    return s * y


@register("erf")
def erf(x):
    return _same_dtype(x, _erf(x))


@register("relu")
def relu(x):
    return np.maximum(x, np.zeros((), x.dtype))


@register("leaky_relu")
def leaky_relu(x, alpha=0.01):
    return _same_dtype(x, np.where(x >= 0, x, x * alpha))


@register("prelu")
def prelu(x, slope):
    return _same_dtype(x, np.where(x >= 0, x, x * slope))


@register("thresholded_relu")
def thresholded_relu(x, alpha=1.0):
    return _same_dtype(x, np.where(x > alpha, x, 0))


@register("elu")
def elu(x, alpha=1.0):
    return _same_dtype(x, np.where(x > 0, x, alpha * (np.exp(x) - 1)))


@register("selu")
def selu(x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return _same_dtype(x, gamma * np.where(x > 0, x, alpha * (np.exp(x) - 1)))


@register("celu")
def celu(x, alpha=1.0):
    return _same_dtype(x, np.maximum(0, x) + np.minimum(0, alpha * (np.exp(x / alpha) - 1)))


@register("sigmoid")
def sigmoid(x):
    return _same_dtype(x, 1.0 / (1.0 + np.exp(-x)))


@register("hard_sigmoid")
def hard_sigmoid(x, alpha=0.2, beta=0.5):
    return _same_dtype(x, np.clip(alpha * x + beta, 0, 1))


@register("hard_swish")
def hard_swish(x):
    return _same_dtype(x, x * np.clip(x / 6 + 0.5, 0, 1))


@register("softplus")
def softplus(x):
    return _same_dtype(x, np.logaddexp(0, x))


@register("softsign")
def softsign(x):
    return _same_dtype(x, x / (1 + np.abs(x)))


@register("mish")
def mish(x):
    return _same_dtype(x, x * np.tanh(np.logaddexp(0, x)))


@register("gelu")
def gelu(x, approximate="none"):
    if approximate == "tanh":
        y = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * np.power(x, 3))))
    else:
        y = 0.5 * x * (1 + _erf(x / np.sqrt(2)))
    return _same_dtype(x, y)


@register("shrink")
def shrink(x, bias=0.0, lambd=0.5):
    return _same_dtype(x, np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)))


@register("clip")
def clip(x, min=None, max=None):  # noqa: A002 - ONNX's input names
    lo = -np.inf if min is None else min
    hi = np.inf if max is None else max
    return _same_dtype(x, np.clip(x, lo, hi))
