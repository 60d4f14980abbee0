"""The neural-network ops of JSON-runtime graphs, on the board's numpy kernels.

Each factory reads one node's attributes once, at ``load_module`` (a bad or unsupported attribute is
refused then), and returns a :class:`Prepared`: ``run(*inputs)`` calls the shared kernels
(``executor/kernels``: ``conv``, ``conv_transpose``, ``matmul``, ``max_pool``, ``average_pool``,
``batch_normalization``, ...), which work channels-first; channels-last data (ACL's NHWC) and other
weight layouts (``OHWI``, ``IHWO``, ``HWIO``) are transposed on the way in and out.  ``weights``
maps an input position to a transform (weight layout to the kernel's); the runtime applies it once
to a constant, per call to a computed tensor.

The composite forms the backends write are parameters of the same factories: a bias input (ACL's
and CLML's ``nn.conv2d`` with three inputs, DNNL's ``_bias``), a fused activation (the
``activation_type`` attribute, DNNL's ``_relu``, ``_clip``, ...), a residual sum (DNNL's ``_sum``:
the last input), a fused batch norm (CLML's ``batchnorm`` attribute and four more inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ...loader.opset import OPS
from ..kernels import KERNELS
from .attrs import Attrs, OpError, inverse, permute, spatial, spatial_pads, to_first, weight_to_first


@dataclass
class Prepared:
    """One node, ready to run: ``run(*inputs)`` returns its output (a tuple for several)."""

    run: Callable[..., Any]
    weights: dict[int, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)


def _gelu(y):
    return KERNELS["gelu"](y)


def _gelu_tanh(y):
    return KERNELS["gelu"](y, approximate="tanh")


#: fused activations by name: ``factory(attrs) -> function of the result``
ACTIVATIONS: dict[str, Callable[[Attrs], Callable[[np.ndarray], np.ndarray]]] = {
    "relu": lambda a: KERNELS["relu"],
    "relu6": lambda a: lambda y: KERNELS["clip"](y, min=0.0, max=6.0),
    "clip": lambda a: (lambda lo, hi: lambda y: KERNELS["clip"](y, min=lo, max=hi))(
        a.float("a_min"), a.float("a_max")),
    "tanh": lambda a: KERNELS["tanh"],
    "sigmoid": lambda a: KERNELS["sigmoid"],
    "gelu": lambda a: _gelu,  # DNNL's gelu_erf
    "gelu_tanh": lambda a: _gelu_tanh,  # BNNS's dense_bias_gelu pattern: the tanh approximation
    "swish": lambda a: lambda y: KERNELS["swish"](y),
    "mish": lambda a: KERNELS["mish"],
}


def activation(a: Attrs, name: Optional[str]) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """The activation ``name`` (or the node's ``activation_type`` attribute), or None."""
    name = name or a.str("activation_type", None)
    if name is None or name == "none":
        return None
    if name not in ACTIVATIONS:
        raise OpError(f"fused activation {name!r} is not supported (known: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name](a)


def _layouts(a: Attrs, rank: int, key: str = "data_layout"):
    k = rank - 2
    if not 1 <= k <= 3:
        raise OpError(f"data of rank {rank} is not supported (1 to 3 spatial axes)")
    data = a.str(key, "NC" + "DHW"[3 - k:])
    first = to_first(data)
    if len(data) != rank:
        raise OpError(f"{key} {data!r} does not fit data of rank {rank}")
    out = a.str("out_layout", data)
    back = inverse(to_first(out, "out"))
    if sorted(out) != sorted(data):
        raise OpError(f"out_layout {out!r} has other axes than {key} {data!r}")
    return data, first, back, k


def conv(node, a: Attrs, shapes, *, bias: Optional[bool] = None, sum_input: bool = False,
         act: Optional[str] = None, transpose: bool = False, ignore: int = 0) -> Prepared:
    """nn.conv{1,2,3}d / nn.depthwise_conv2d / nn.conv2d_transpose and their composites (``ignore``:
    trailing inputs the composite carries but does not need, DNNL's gelu and mish constants)."""
    data, xperm, back, k = _layouts(a, len(shapes[0]))
    spatial_axes = "".join(c for c in data if c not in "NC")
    order = "IO" if transpose else "OI"
    kernel = a.str("kernel_layout", order + spatial_axes)
    wperm = weight_to_first(kernel, data, order)
    groups = a.int("groups", 1)
    strides, dilations = spatial(a, "strides", k, 1), spatial(a, "dilation", k, 1)
    pads = spatial_pads(a.ints("padding", [0]), k)
    a.out_dtype()
    bn = a.raw("batchnorm", None)  # CLML: axis, epsilon, center, scale
    extra = len(node.inputs) - 2 - (4 if bn else 0) - int(sum_input) - ignore
    if bias is None:
        bias = extra == 1
    if extra != int(bias):
        raise OpError(f"takes {2 + int(bias) + (4 if bn else 0) + int(sum_input) + ignore} inputs here "
                      f"(data, weight{', bias' if bias else ''}{', 4 batch-norm' if bn else ''}"
                      f"{', sum' if sum_input else ''}), got {len(node.inputs)}")
    post = activation(a, act)
    epsilon = float(bn[1]) if bn else 0.0
    fuse = post is KERNELS["relu"] and not bn and not sum_input and not transpose
    extra_attrs = {"output_padding": spatial(a, "output_padding", k, 0)} if transpose else {}
    kernel_fn = KERNELS["conv_transpose" if transpose else "conv"]

    def run(x, w, *rest):
        rest = rest[:len(rest) - ignore]
        b = rest[0].reshape(-1) if bias else None
        y = kernel_fn(permute(x, xperm), w, b, group=groups, pads=pads, strides=strides,
                      dilations=dilations, **({"activation": "relu"} if fuse else extra_attrs))
        if bn:
            g, beta, mean, var = rest[int(bias):int(bias) + 4]
            y = KERNELS["batch_normalization"](y, g, beta, mean, var, epsilon=epsilon)
        y = permute(y, back)
        if sum_input:
            y = KERNELS["add"](y, rest[-1])
        return post(y) if post is not None and not fuse else y

    return Prepared(run, {1: (lambda w: permute(w, wperm))} if wperm else {})


def dense(node, a: Attrs, shapes, *, bias: Optional[bool] = None, sum_input: bool = False,
          act: Optional[str] = None, ignore: int = 0) -> Prepared:
    """nn.dense (weight ``(units, in)``) with an optional bias, residual sum and activation."""
    a.out_dtype()
    extra = len(node.inputs) - 2 - int(sum_input) - ignore
    if bias is None:
        bias = extra == 1
    if extra != int(bias):
        raise OpError(f"takes {2 + int(bias) + int(sum_input) + ignore} inputs here, got {len(node.inputs)}")
    post = activation(a, act)

    def run(x, wt, *rest):
        rest = rest[:len(rest) - ignore]
        y = KERNELS["matmul"](x, wt, rest[0].reshape(-1) if bias else None)
        if sum_input:
            y = KERNELS["add"](y, rest[-1])
        return y if post is None else post(y)

    return Prepared(run, {1: lambda w: np.ascontiguousarray(w.T)})


def matmul(node, a: Attrs, shapes, *, batch: bool) -> Prepared:
    """nn.batch_matmul (``transpose_b`` defaults to true, as in relay) and nn.matmul."""
    ta, tb = a.bool("transpose_a", False), a.bool("transpose_b", batch)
    a.out_dtype()

    def run(x, y):
        return KERNELS["matmul"](np.swapaxes(x, -1, -2) if ta else x, np.swapaxes(y, -1, -2) if tb else y)

    return Prepared(run)


def _channel_axis(a: Attrs, rank: int) -> int:
    axis = a.int("axis", 1)
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def batch_norm(node, a: Attrs, shapes) -> Prepared:
    """nn.batch_norm (data, gamma, beta, mean, var); three outputs when the node declares them."""
    axis, eps = _channel_axis(a, len(shapes[0])), a.float("epsilon", 1e-5)
    center, scale = a.bool("center", True), a.bool("scale", True)
    if node.num_outputs not in (1, 3):
        raise OpError(f"declares {node.num_outputs} outputs (1 or 3 expected)")

    def run(x, g, beta, mean, var):
        g = g if scale else np.ones_like(g)
        beta = beta if center else np.zeros_like(beta)
        y = np.moveaxis(KERNELS["batch_normalization"](np.moveaxis(x, axis, 1), g, beta, mean, var,
                                                       epsilon=eps), 1, axis)
        return (y, mean, var) if node.num_outputs == 3 else y

    return Prepared(run)


def layer_norm(node, a: Attrs, shapes) -> Prepared:
    """nn.layer_norm over one axis (data, gamma, beta)."""
    rank = len(shapes[0])
    axis = a.int("axis", -1) % rank
    eps, center, scale = a.float("epsilon", 1e-5), a.bool("center", True), a.bool("scale", True)

    def run(x, g, beta):
        g = g if scale else np.ones_like(g)
        beta = beta if center else np.zeros_like(beta)
        y = KERNELS["layer_normalization"](np.moveaxis(x, axis, -1), g, beta, axis=-1, epsilon=eps)
        y = y[0] if isinstance(y, tuple) else y  # ONNX's LayerNormalization also gives mean and 1/std
        return np.moveaxis(y, -1, axis)

    return Prepared(run)


def instance_norm(node, a: Attrs, shapes) -> Prepared:
    """nn.instance_norm (data, gamma, beta), channels on ``axis``."""
    axis, eps = _channel_axis(a, len(shapes[0])), a.float("epsilon", 1e-5)
    center, scale = a.bool("center", True), a.bool("scale", True)

    def run(x, g, beta):
        g = g if scale else np.ones_like(g)
        beta = beta if center else np.zeros_like(beta)
        y = KERNELS["instance_normalization"](np.moveaxis(x, axis, 1), g, beta, epsilon=eps)
        return np.moveaxis(y, 1, axis)

    return Prepared(run)


def _integer_mean(fn, dtype: np.dtype):
    """An average pool of integers as TVM computes the quantized one (``cast(int32) -> avg pool -> cast``): the
    exact window sum divided by the count, truncated (float64 holds both exactly, and a quotient that is not an
    integer is at least 1/count from one)."""
    return lambda x, **attrs: np.trunc(fn(x.astype(np.float64), **attrs)).astype(dtype)


def pool(node, a: Attrs, shapes, *, kind: str) -> Prepared:
    """nn.{max,avg,l2}_pool{1,2,3}d in any plain layout (the ``layout`` attribute); max and avg of int8/uint8
    data too (ACL's quantized pools)."""
    data, xperm, back, k = _layouts(a, len(shapes[0]), "layout")
    size = spatial(a, "pool_size", k, 1)
    attrs = dict(kernel_shape=size, strides=spatial(a, "strides", k, 1), dilations=spatial(a, "dilation", k, 1),
                 pads=spatial_pads(a.ints("padding", [0]), k), ceil_mode=int(a.bool("ceil_mode", False)))
    if kind != "max":
        attrs["count_include_pad"] = int(a.bool("count_include_pad", False))
    integer = np.dtype(node.dtypes[0]).kind in "iu"
    if integer and kind == "l2":
        raise OpError(f"an l2 pool of {node.dtypes[0]} is not supported (float only)")
    average = _integer_mean(KERNELS["average_pool"], np.dtype(node.dtypes[0])) if integer else \
        KERNELS["average_pool"]

    def run(x):
        x = permute(x, xperm)
        if kind == "max":
            y = KERNELS["max_pool"](x, **attrs)
        elif kind == "avg":
            y = average(x, **attrs)
        else:  # ACL's l2 pool: the root of the mean of squares
            y = KERNELS["sqrt"](KERNELS["average_pool"](KERNELS["mul"](x, x), **attrs))
        return permute(y, back)

    return Prepared(run)


def global_pool(node, a: Attrs, shapes, *, kind: str) -> Prepared:
    """nn.global_{max,avg}_pool2d in any plain layout (int8/uint8 data too: an average truncated as TVM's)."""
    data, xperm, back, k = _layouts(a, len(shapes[0]), "layout")
    fn = KERNELS["global_max_pool" if kind == "max" else "global_average_pool"]
    if kind == "avg" and np.dtype(node.dtypes[0]).kind in "iu":
        fn = _integer_mean(fn, np.dtype(node.dtypes[0]))
    return Prepared(lambda x: permute(fn(permute(x, xperm)), back))


def adaptive_pool(node, a: Attrs, shapes, *, kind: str) -> Prepared:
    """nn.adaptive_{max,avg}_pool2d, for outputs whose windows tile the input evenly."""
    data, xperm, back, k = _layouts(a, len(shapes[0]), "layout")
    first = [shapes[0][i] for i in xperm] if xperm else list(shapes[0])
    out = a.ints("output_size", [1] * k)
    out = out * k if len(out) == 1 else out
    if len(out) != k or any(o <= 0 or s % o for s, o in zip(first[2:], out)):
        raise OpError(f"output_size {out} does not divide the input's spatial size {first[2:]}")
    window = [s // o for s, o in zip(first[2:], out)]
    fn = KERNELS["max_pool" if kind == "max" else "average_pool"]
    return Prepared(lambda x: permute(fn(permute(x, xperm), kernel_shape=window, strides=window), back))


def bias_add(node, a: Attrs, shapes) -> Prepared:
    rank = len(shapes[0])
    axis = a.int("axis", 1)
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} out of range for rank {rank}")
    shape = [1] * rank
    shape[axis % rank] = -1
    return Prepared(lambda x, b: KERNELS["add"](x, b.reshape(shape)))


def _check_count(node, n: int) -> None:
    if len(node.inputs) != n:
        raise OpError(f"takes {n} input(s), got {len(node.inputs)}")


#: how many inputs the fixed-arity factories take (the composite ones count their own): the inputs of the op of
#: the op language each relay op is (its schema's, ``rpcsrv.loader.opset``), or relay's own count
ARITY = {**{f: int(OPS[k].max_inputs) for f, k in ((batch_norm, "batch_normalization"),
                                                   (layer_norm, "layer_normalization"),
                                                   (instance_norm, "instance_normalization"), (pool, "max_pool"),
                                                   (global_pool, "global_max_pool"), (adaptive_pool, "max_pool"))},
         bias_add: 2, matmul: 2}


def checked(factory, **options):
    """``factory`` with its input count checked against the node first (when it has a fixed one)."""
    def make(node, a, shapes):
        if factory in ARITY:
            _check_count(node, ARITY[factory])
        return factory(node, a, shapes, **options)
    make.__doc__ = factory.__doc__
    return make


