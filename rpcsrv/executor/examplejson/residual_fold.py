"""A residual Add folded into the 1x1 conv whose output it adds (inverted residuals, ResNet bottlenecks).

A residual block ends in ``Add(conv(x, W, b), r)`` (ResNet: with a fused Relu): the 1x1 projection's
product gets its bias in one pass over the output (``epilogue.c``), then the Add reads it again with the
residual and writes a third tensor, and each is a step of the run (a table kernel or plan call: 10-25 us
inside a model run, where the interpreter's code is cold).  Folded, the conv reads (x, W, b, r) and its
plan adds the bias and the residual and applies the activation in the one epilogue pass
(``rpcsrv_add_act_f32``, in place on the product).

A pair is folded only when the conv is a float32 1x1 conv of group 1 (or one with a squeeze-and-excitation
scale folded in, ``scale_fold``: MobileNetV3's and EfficientNet's projections) without a fused activation, its
output has the Add as its one reader and is no subgraph output, the other operand has the Add's shape, and
the compiled kernels are in use when the subgraph is made (the numpy fallback keeps the graph as it is).
The folded node takes the Add's ID and place in the run (the residual is computed by then); its table
kernel (below) computes conv + r and the activation as the two nodes did, so results are the same.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from .text import Node, Subgraph, input_counts, rewritten

F32 = np.dtype(np.float32)
_FUSED = ("activation", "activation_attrs")


def residual(conv: Callable, apply_activation: Callable, scaled: bool = False) -> Callable:
    """The conv kernel reading (x, w, b, r) for act(conv(x, w, b) + r); ``scaled``: ``conv`` is scale_fold's,
    reading (x, s, w, b, r)."""

    def residual_conv(*args, activation=None, activation_attrs=None, **attrs):
        y = conv(*args[:-1], **attrs) + args[-1]
        return apply_activation(y, activation, activation_attrs, "add")

    residual_conv.plan_as = "scaled_residual_conv" if scaled else "residual_conv"
    return residual_conv


def _projection(graph: Subgraph, node: Node, scaled: bool) -> bool:
    """Whether ``node`` is a float32 1x1 group-1 conv without a fused activation (``scaled``: scale_fold's,
    reading (x, s, w[, b]))."""
    if node.kind != "op" or node.op != "conv" or node.dtype != F32 or len(node.shape) != 4 \
            or len(node.inputs) - scaled not in (2, 3) or any(k in node.attrs for k in _FUSED + ("input_shuffle",)):
        return False
    w = graph.nodes.get(node.inputs[1 + scaled])
    return w is not None and w.kind == "const" and len(w.shape) == 4 and w.shape[2:] == (1, 1) \
        and node.attrs.get("group", 1) == 1


def fold_residuals(graph: Subgraph, ops: list[Node], kernels, folded) -> tuple[list[Node], dict[int, Callable]]:
    """``ops`` with each foldable (1x1 conv, residual Add) pair made one node at the Add's place (with the
    Add's ID), and the kernels of those nodes by node ID.  ``folded``: the convs scale_fold rewrote (node
    ID -> kernel), folded with their scale."""
    from ..kernels.clib import compiled
    from ..kernels.registry import apply_activation

    if "conv" not in kernels or compiled.library() is None:
        return ops, {}
    readers = input_counts(ops)
    outputs, by_id = set(graph.outputs), {node.id: node for node in ops}
    dropped, replaced, override = set(), {}, {}
    for node in ops:
        if node.op not in ("add", "sum") or len(node.inputs) != 2 or node.dtype != F32 or len(node.shape) != 4 \
                or node.id in folded or set(node.attrs) - set(_FUSED):
            continue
        for ci, ri in (node.inputs, node.inputs[::-1]):
            conv, r, scaled = by_id.get(ci), graph.nodes.get(ri), ci in folded
            if conv is None or r is None or ci == ri or conv.id in dropped or readers.get(ci) != 1 \
                    or ci in outputs or conv.shape != node.shape or r.shape != node.shape or r.dtype != F32 \
                    or not _projection(graph, conv, scaled):
                continue
            if not (node.attrs.get("activation") is None and not node.attrs.get("activation_attrs")
                    or compiled.fuses(node.attrs.get("activation"), node.attrs.get("activation_attrs"))):
                break
            k = 2 + scaled  # the bias's place
            b = conv.inputs[k] if len(conv.inputs) > k else -1
            dropped.add(conv.id)
            replaced[node.id] = dataclasses.replace(conv, id=node.id, inputs=tuple(conv.inputs[:k]) + (b, ri),
                                                    attrs={**conv.attrs, **node.attrs})
            override[node.id] = residual(folded[ci] if scaled else kernels["conv"], apply_activation, scaled)
            break
    return rewritten(ops, replaced, dropped), override
