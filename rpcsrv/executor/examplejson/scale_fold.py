"""Squeeze-and-excitation's channel scaling folded into the 1x1 conv that reads it (EfficientNet, MobileNetV3).

An SE block ends in ``Mul(x, s)``: every channel of the (N, C, H, W) feature map ``x`` times its gate
``s`` (1, C, 1, 1), and the block's projection conv reads that product.  Scaling an input channel of a
group-1 conv is scaling the weight column that reads it, so ``conv(x * s, W) == conv(x, W * s)``: the
product of C*H*W values becomes one of M*C weights (40 x 240 against 240 x 28 x 28 in EfficientNet-B0's
third stage), and the scaled map is never written.  Measured on EfficientNet-B0, 1 thread: its Muls took
0.8 ms against onnxruntime's 0.4 (see docs/executor.md).

A pair is folded only when the Mul's result has that one reader, is no subgraph output, and the shapes
declare exactly this pattern (float32 x of the Mul's shape, s of (1, C, 1, 1) or (C, 1, 1), a 1x1
group-1 conv without ``input_shuffle``); 1x1 only, so no cached weight preparation (Winograd's, taps')
is rebuilt for weights that are new at each call.  The rounding differs from the unfolded form by
float32 ulps only.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from .text import Node, Subgraph, input_counts, rewritten

F32 = np.dtype(np.float32)


def _scale_operands(graph: Subgraph, mul: Node) -> tuple[int, int] | None:
    """(x, s) node IDs of a channel-scaling Mul, or None."""
    if len(mul.inputs) != 2 or mul.attrs or len(mul.shape) != 4 or mul.dtype != F32:
        return None
    c = mul.shape[1]
    for a, b in (mul.inputs, mul.inputs[::-1]):
        na, nb = graph.nodes.get(a), graph.nodes.get(b)
        if na is not None and nb is not None and na.shape == mul.shape and na.dtype == F32 == nb.dtype \
                and nb.shape in ((1, c, 1, 1), (c, 1, 1)):
            return a, b
    return None


def _foldable_conv(graph: Subgraph, conv: Node) -> bool:
    w = graph.nodes.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
    return (w is not None and len(w.shape) == 4 and w.shape[2:] == (1, 1) and w.dtype == F32
            and conv.attrs.get("group", 1) == 1 and conv.attrs.get("input_shuffle", 1) == 1)


def scaled(conv: Callable) -> Callable:
    """The conv kernel reading (x, s, w[, b]) for conv(x * s, w[, b]): the scale goes into w's columns."""

    def scaled_conv(x, s, w, b=None, **attrs):
        w = np.asarray(w)
        return conv(x, w * np.asarray(s, w.dtype).reshape(1, w.shape[1], 1, 1), b, **attrs)

    scaled_conv.plan_as = "scaled_conv"  # kernels.plans has a plan for it (the scale on the smaller side)
    return scaled_conv


def fold_scales(graph: Subgraph, kernels) -> tuple[list[Node], dict[int, Callable]]:
    """The subgraph's op nodes to run, with each foldable Mul left out and its conv reading the Mul's
    inputs, and the kernels of those convs by node ID."""
    ops = list(graph.ops)
    if "conv" not in kernels:
        return ops, {}
    readers = input_counts(ops)
    outputs = set(graph.outputs)
    dropped, replaced, override = set(), {}, {}
    for node in ops:
        src = graph.nodes.get(node.inputs[0]) if node.op == "conv" and node.inputs else None
        if src is None or src.kind != "op" or src.op != "mul" or readers.get(src.id) != 1 or src.id in outputs:
            continue
        operands = _scale_operands(graph, src)
        if operands is None or not _foldable_conv(graph, node):
            continue
        dropped.add(src.id)
        replaced[node.id] = dataclasses.replace(node, inputs=operands + tuple(node.inputs[1:]))
        override[node.id] = scaled(kernels["conv"])
    return rewritten(ops, replaced, dropped), override
