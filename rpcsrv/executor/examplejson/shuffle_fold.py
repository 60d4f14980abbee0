"""ShuffleNetV2's Concat and channel shuffle made one step that writes the shuffled tensor in one pass.

Each ShuffleNetV2 unit ends in ``Concat(a, b)`` along the channels, then the channel shuffle
``Reshape (N, g, C/g, ...) → Transpose(0, 2, 1, ...) → Reshape (N, C, ...)``, and the next unit splits the
result in two halves (``Slice`` twice, or ``Split``).  Run node by node, the Concat copies the feature
map, the second Reshape copies it again (the transposed view is not contiguous), and each Slice is a
step of its own (6-10 us of argument parsing for a view).  Folded, one node reads the Concat's inputs
and writes each straight into its shuffled channels of a fresh contiguous tensor (numpy strided copies,
whole rows of the spatial dims): one copy of the map instead of two, and three steps fewer.  The slices
of that tensor then take their index worked out once per bound constant (``slice_index``, the table
kernel's own code) and return the same views as the table kernel.

A chain is folded only when it computes exactly what the nodes compute: a Concat along axis 1 of inputs
of its dtype, a Reshape of its output to ``(N, g, C/g, rest...)`` by a constant shape, a Transpose with
``perm`` ``[0, 2, 1, 3, ...]``, a Reshape back to the Concat's shape by a constant shape, each
intermediate read by the next node alone and no subgraph output.  The folded node takes the last
Reshape's ID and place and reads ``(inputs..., shape1, shape2)``; the first time it sees a pair of
bound shape constants it checks them with the table's reshape kernel on zero-stride stand-ins (no
memory), so a constant that does not give the declared shapes fails as the unfolded nodes would.

Every node that remains keeps its value (``byoc compare`` pairs each step's ID with its ONNX tensor).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from .text import Node, Subgraph, input_counts, rewritten

#: the Slice inputs after the data: starts, ends, axes, steps
_SLICE_PARAMS = 4


def _concat_inputs(graph: Subgraph, cat: Node) -> list[int] | None:
    """The channel counts of ``cat``'s inputs when it is a concat along axis 1 of computed or bound tensors of
    its dtype and shape but for the channels, else None."""
    shape, rank = cat.shape, len(cat.shape)
    axis = cat.attrs.get("axis")
    if cat.op != "concat" or rank < 2 or set(cat.attrs) != {"axis"} or not isinstance(axis, int) \
            or not -rank <= axis < rank or axis % rank != 1 or not cat.inputs \
            or any(i < 0 or i not in graph.nodes for i in cat.inputs):
        return None
    ins = [graph.nodes[i] for i in cat.inputs]
    if any(x.dtype != cat.dtype or len(x.shape) != rank or x.shape[0] != shape[0] or x.shape[2:] != shape[2:]
           for x in ins) or sum(x.shape[1] for x in ins) != shape[1]:
        return None
    return [x.shape[1] for x in ins]


def _shuffle(graph: Subgraph, r2: Node, single: Callable) -> tuple[Node, Node, Node, int] | None:
    """(concat, reshape 1, transpose, g) when ``r2`` ends a foldable Concat → channel shuffle, else None;
    ``single(id, op)``: the node of that ID when it is such an op read once and no subgraph output."""
    def const(nid: int) -> bool:
        return nid in graph.nodes and graph.nodes[nid].kind == "const"

    if len(r2.inputs) != 2 or not const(r2.inputs[1]):
        return None
    t = single(r2.inputs[0], "transpose")
    r1 = single(t.inputs[0], "reshape") if t is not None and len(t.inputs) == 1 else None
    cat = single(r1.inputs[0], "concat") if r1 is not None and len(r1.inputs) == 2 and const(r1.inputs[1]) \
        else None
    if cat is None or _concat_inputs(graph, cat) is None or set(t.attrs) != {"perm"} \
            or set(r1.attrs) - {"allowzero"} or set(r2.attrs) - {"allowzero"}:
        return None
    (n, c), rest, rank = cat.shape[:2], cat.shape[2:], len(cat.shape)
    g = r1.shape[1] if len(r1.shape) == rank + 1 else 0
    if not g or c % g or r1.shape != (n, g, c // g) + rest or list(t.attrs["perm"]) != [0, 2, 1] + list(
            range(3, rank + 1)) or t.shape != (n, c // g, g) + rest or r2.shape != cat.shape \
            or not all(v.dtype == cat.dtype for v in (r1, t, r2)):
        return None
    return cat, r1, t, g


def shuffle_concat(sizes: list[int], shape: tuple, dtype: np.dtype, g: int, check: Callable) -> Callable:
    """The folded node's kernel for the Concat of its inputs (``sizes`` channels each) along axis 1 shuffled in
    ``g`` groups; ``check``: the folded Reshapes' check of their shape constants, read as two last inputs."""
    n, c, hw = shape[0], shape[1], math.prod(shape[2:])
    cg = c // g
    pieces = []  # (input, its first and end channel, group, first and end channel within the group)
    offset = 0
    for k, size in enumerate(sizes):
        start = offset
        while start < offset + size:
            group, i0 = divmod(start, cg)
            end = min(offset + size, (group + 1) * cg)
            pieces.append((k, start - offset, end - offset, group, i0, i0 + end - start))
            start = end
        offset += size
    flat = [(n, size, hw) for size in sizes]

    def write(inputs) -> np.ndarray:
        out = np.empty(shape, dtype)
        view = out.reshape(n, cg, g, hw)
        for k, a0, a1, group, i0, i1 in pieces:
            np.copyto(view[:, i0:i1, group], inputs[k].reshape(flat[k])[:, a0:a1], casting="no")
        return out

    checked: list = [None, None]  # the shape constants last checked (the same objects while bound)

    def kernel(*args):
        s1, s2 = args[-2], args[-1]
        if s1 is not checked[0] or s2 is not checked[1]:
            check(s1, s2)
            checked[:] = [s1, s2]
        return write(args[:-2])

    return kernel


def reshape_check(reshape: Callable, cat: Node, r1: Node, t: Node, r2: Node) -> Callable:
    """``check(s1, s2)``: an error unless the table's ``reshape`` gives the declared shapes with the bound
    shape constants (run on zero-stride stand-ins: no memory)."""
    def check(s1, s2) -> None:
        for src, const, attrs, want in ((cat.shape, s1, r1.attrs, r1.shape), (t.shape, s2, r2.attrs, cat.shape)):
            got = reshape(np.broadcast_to(np.zeros((), cat.dtype), src), const, **attrs).shape
            if got != want:
                raise ValueError(f"the channel shuffle's reshape gives {list(got)}, the node declares {list(want)}")

    return check


def cached_slice(table_slice: Callable) -> Callable:
    """A Slice kernel whose numpy index is worked out once per input shape and bound constants (the table
    kernel's ``slice_index``); anything else goes to ``table_slice``."""
    from ..kernels.shape import slice_index

    memo: list = [None]  # (input shape, constants, index)

    def kernel(x, *params):
        m = memo[0]
        if type(x) is np.ndarray and m is not None and x.shape == m[0] and all(
                p is q for p, q in zip(params, m[1])):
            return x[m[2]]
        if type(x) is not np.ndarray:
            return table_slice(x, *params)
        index = slice_index(x.shape, *params)
        memo[0] = (x.shape, params, index)
        return x[index]

    return kernel


def fold_shuffles(graph: Subgraph, ops: list[Node], kernels) -> tuple[list[Node], dict[int, Callable]]:
    """``ops`` with each foldable Concat → channel shuffle made one node at the last Reshape's place (with its
    ID), and the kernels by node ID of those nodes and of the constant-index Slices reading them."""
    if not {"concat", "reshape", "transpose", "slice"} <= set(kernels):
        return ops, {}
    readers = input_counts(ops)
    outputs, by_id = set(graph.outputs), {node.id: node for node in ops}

    def single(nid: int, op: str) -> Node | None:
        node = by_id.get(nid)
        return node if node is not None and node.op == op and readers.get(nid) == 1 and nid not in outputs else None

    dropped: set[int] = set()
    replaced: dict[int, Node] = {}
    override: dict[int, Callable] = {}
    for node in ops:
        found = _shuffle(graph, node, single) if node.op == "reshape" else None
        if found is None:
            continue
        cat, r1, t, g = found
        dropped.update((cat.id, r1.id, t.id))
        replaced[node.id] = dataclasses.replace(node, inputs=tuple(cat.inputs) + (r1.inputs[1], node.inputs[1]),
                                                attrs={})
        override[node.id] = shuffle_concat(_concat_inputs(graph, cat), cat.shape, cat.dtype, g,
                                           reshape_check(kernels["reshape"], cat, r1, t, node))
    for node in ops:
        if node.op == "slice" and node.inputs and node.inputs[0] in override and not node.attrs \
                and len(node.inputs) <= 1 + _SLICE_PARAMS and node.inputs[0] not in node.inputs[1:] and all(
                i < 0 or graph.nodes[i].kind == "const" for i in node.inputs[1:]):
            override[node.id] = cached_slice(kernels["slice"])
    return rewritten(ops, replaced, dropped), override
