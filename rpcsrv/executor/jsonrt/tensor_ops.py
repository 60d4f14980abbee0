"""Element-wise, reduction and shape ops of JSON-runtime graphs, on the board's numpy kernels.

Same contract as ``nn.py``: a factory reads the node's attributes at ``load_module`` and returns a
:class:`~rpcsrv.executor.jsonrt.nn.Prepared`.  A relay op that is one op of the op language is a
:class:`Direct` row, everything about it but its relay attribute names taken from the op's schema.
Ops that only change the shape (``reshape``, ``nn.batch_flatten``, ``squeeze``, ``expand_dims``) take
the output shape the graph declares, so relay's special reshape codes (0, -1, -2, ...) need no
interpretation here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ...loader.opset import OPS, node_problems
from ..kernels import KERNELS
from .attrs import Attrs, OpError, to_first
from .nn import Prepared


def _arity(node, n: int) -> None:
    if len(node.inputs) != n:
        raise OpError(f"takes {n} input(s), got {len(node.inputs)}")


@dataclass(frozen=True)
class Direct:
    """A relay op that is one op of the op language (``rpcsrv.loader.opset``): ``kernel``; ``names``: relay's
    attribute -> the kernel's (read as the kind the schema declares; absent: the schema's default); ``fixed``:
    attributes set whatever the node says.  The input count, the attributes' kinds and allowed values and the
    dtype rule are the schema's, checked at ``load_module`` as the ExampleJSON parser checks its ops."""

    kernel: str
    names: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, node, a: Attrs, shapes) -> Prepared:
        spec = OPS[self.kernel]
        attrs = dict(self.fixed)
        for relay, name in self.names.items():
            value = a.as_kind(relay, spec.attrs[name].kind)
            if value is not None:
                attrs[name] = value
        problems = node_problems(self.kernel, attrs, [True] * len(node.inputs), a.input_dtypes)
        if problems:
            raise OpError("; ".join(problems))
        fn = KERNELS[self.kernel]
        return Prepared((lambda *xs: fn(*xs, **attrs)) if attrs else fn)


def to_declared_shape(node, a: Attrs, shapes) -> Prepared:
    """reshape / nn.batch_flatten / squeeze / expand_dims: the output shape the graph declares."""
    if not node.inputs:
        raise OpError("takes one data input")
    shape = node.shapes[0]
    if int(np.prod(shape)) != int(np.prod(shapes[0])):
        raise OpError(f"cannot reshape {list(shapes[0])} into the declared {list(shape)}")
    return Prepared(lambda x, *_: np.reshape(x, shape))


def transpose(node, a: Attrs, shapes) -> Prepared:
    _arity(node, 1)
    rank = len(shapes[0])
    axes = a.ints("axes", None)
    if axes is not None:
        if sorted(ax % rank for ax in axes if -rank <= ax < rank) != list(range(rank)):
            raise OpError(f"axes {axes} are not a permutation of {rank} axes")
        axes = [ax % rank for ax in axes]
    return Prepared(lambda x: KERNELS["transpose"](x, perm=axes))


def layout_transform(node, a: Attrs, shapes) -> Prepared:
    _arity(node, 1)
    src, dst = a.str("src_layout"), a.str("dst_layout")
    to_first(src, "src")
    if sorted(src) != sorted(dst):
        raise OpError(f"layout_transform {src} -> {dst} is not a plain permutation")
    perm = [src.index(c) for c in dst]
    return Prepared(lambda x: KERNELS["transpose"](x, perm=perm))


def concatenate(node, a: Attrs, shapes) -> Prepared:
    rank = len(shapes[0])
    axis = a.int("axis", 0)
    if not -rank <= axis < rank:
        raise OpError(f"axis {axis} out of range for rank {rank}")
    return Prepared(lambda *xs: KERNELS["concat"](*xs, axis=axis % rank))


def reduce(kernel: str):
    """sum / mean / max / min / prod over ``axis`` (all when absent), ``keepdims``, ``exclude``."""
    def make(node, a: Attrs, shapes) -> Prepared:
        _arity(node, 1)
        rank = len(shapes[0])
        axes = a.ints("axis", None)
        axes = list(range(rank)) if axes is None else [ax % rank for ax in axes if -rank <= ax < rank] \
            if all(-rank <= ax < rank for ax in axes) else None
        if axes is None:
            raise OpError(f"axis {a.raw('axis')} out of range for rank {rank}")
        if a.bool("exclude", False):
            axes = [ax for ax in range(rank) if ax not in axes]
        keep = int(a.bool("keepdims", False))
        fn = KERNELS[kernel]
        return Prepared(lambda x: fn(x, axes=axes, keepdims=keep) if axes else x.copy())
    make.__doc__ = f"reduction -> kernel {kernel!r}"
    return make


def pad(node, a: Attrs, shapes) -> Prepared:
    """nn.pad as TensorRT writes it (``padding``: top, left, bottom, right of the last two axes) or
    CLML (``pad_width``: begin, end per axis); an optional second input is the pad value."""
    rank = len(shapes[0])
    if len(node.inputs) not in (1, 2):
        raise OpError(f"takes 1 or 2 inputs, got {len(node.inputs)}")
    mode = a.str("pad_mode", "constant")
    if mode != "constant":
        raise OpError(f"pad_mode {mode!r} is not supported (constant only)")
    if a.raw("pad_width", None) is not None:
        width = a.ints("pad_width")
        if len(width) != 2 * rank:
            raise OpError(f"pad_width {width} does not fit rank {rank}")
        pairs = [(width[2 * i], width[2 * i + 1]) for i in range(rank)]
    else:
        top, left, bottom, right = (a.ints("padding") + [0, 0, 0, 0])[:4]
        pairs = [(0, 0)] * (rank - 2) + [(top, bottom), (left, right)]
    pads = [p[0] for p in pairs] + [p[1] for p in pairs]
    value = a.float("pad_value", 0.0)

    def run(x, v=None):
        return KERNELS["pad"](x, pads=pads, value=float(np.asarray(v).reshape(-1)[0]) if v is not None else value)

    return Prepared(run)


def strided_slice(node, a: Attrs, shapes) -> Prepared:
    """strided_slice as TensorRT writes it (``start``, ``size``, ``strides``) or relay's own attributes
    (``begin``, ``end``, ``strides``, ``axes``, ``slice_mode`` end or size)."""
    _arity(node, 1)
    shape = shapes[0]
    rank = len(shape)
    if a.raw("start", None) is not None:
        start, size, step = a.ints("start"), a.ints("size"), a.ints("strides")
        index = tuple(slice(b, b + n * s, s) for b, n, s in zip(start, size, step))
    else:
        begin, end = a.ints("begin"), a.ints("end")
        step = a.ints("strides", [1]) or [1]
        axes = a.ints("axes", None) or list(range(len(begin)))
        mode = a.str("slice_mode", "end")
        index = [slice(None)] * rank
        for k, ax in enumerate(axes):
            if mode == "size":  # end is the slice's length (-1: to the end), strides do not apply
                index[ax] = slice(begin[k], None if end[k] == -1 else begin[k] % shape[ax] + end[k])
            else:
                index[ax] = slice(begin[k], end[k], step[k] if k < len(step) else step[-1])
        index = tuple(index)
    return Prepared(lambda x: np.ascontiguousarray(x[index]))


def split(node, a: Attrs, shapes) -> Prepared:
    """split into the node's outputs (``indices_or_sections``, ``axis``)."""
    _arity(node, 1)
    rank = len(shapes[0])
    axis = a.int("axis", 0) % rank
    mode = a.str("mode", "sections")
    parts = a.ints("indices_or_sections")
    cut = parts[0] if mode == "sections" and len(parts) == 1 else parts
    return Prepared(lambda x: tuple(np.split(x, cut, axis=axis)))


def depth_to_space(node, a: Attrs, shapes) -> Prepared:
    """nn.depth_to_space (``block_size``, ``layout``, ``mode`` DCR or CRD)."""
    _arity(node, 1)
    layout = a.str("layout", "NCHW")
    perm = to_first(layout)
    back = None if perm is None else [int(i) for i in np.argsort(perm)]
    size, mode = a.int("block_size"), a.str("mode", "DCR")
    if mode not in ("DCR", "CRD") or size < 1:
        raise OpError(f"block_size {size} / mode {mode!r} not supported (DCR or CRD, size >= 1)")

    def run(x):
        y = KERNELS["depth_to_space"](x if perm is None else x.transpose(perm), blocksize=size, mode=mode)
        return y if back is None else np.ascontiguousarray(y.transpose(back))

    return Prepared(run)


def upsampling(node, a: Attrs, shapes) -> Prepared:
    """nn.upsampling: relay resizes with ``asymmetric`` coordinates (``align_corners`` when asked) and,
    for nearest neighbour, floor rounding (topi ``upsampling`` / ``resize2d``)."""
    _arity(node, 1)
    perm = to_first(a.str("layout", "NCHW"))
    back = None if perm is None else [int(i) for i in np.argsort(perm)]
    scales = np.array([1, 1, a.float("scale_h"), a.float("scale_w")], "float32")
    method = a.str("method", "nearest_neighbor")
    modes = {"nearest_neighbor": "nearest", "bilinear": "linear", "bicubic": "cubic"}
    if method not in modes:
        raise OpError(f"method {method!r} is not supported ({', '.join(modes)})")
    coords = "align_corners" if a.bool("align_corners", False) else "asymmetric"
    opts = dict(mode=modes[method], coordinate_transformation_mode=coords, nearest_mode="floor")
    if method == "bicubic":
        opts["cubic_coeff_a"] = -0.5  # topi's bicubic

    def run(x):
        y = KERNELS["resize"](x if perm is None else x.transpose(perm), None, scales, **opts)
        return y if back is None else np.ascontiguousarray(y.transpose(back))

    return Prepared(run)
