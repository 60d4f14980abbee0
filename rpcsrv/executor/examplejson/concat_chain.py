"""Growing concatenations written in place (DenseNet: each layer concatenates all the features before it).

A *chain* is a run of ``concat`` nodes of one subgraph, each taking the previous one's output as its
first input (and nothing else as a first input of a concat), along an axis with only 1s before it, so
that every prefix along that axis is one contiguous block.  The chain's first node allocates one
buffer of the last node's shape and writes its inputs at the front; each later node writes only its
new inputs after the prefix it receives and returns a view of the longer prefix.  A chain of L nodes
then copies each feature map once instead of O(L) times (DenseNet-121: 58 concats).

Why the views stay right: kernels never write their inputs, and every write lands past the end of all
the prefixes handed out so far (they are handed out in execution order), so a view keeps its value for
as long as it lives.  Each call allocates its own buffer, so calls from several threads do not share one.
Whenever a node does not receive the prefix it expects (a shape or dtype the graph did not declare),
it falls back to ``concat``'s own kernel semantics: a fresh buffer, or that kernel's error.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .text import Node, Subgraph


def _axis(node: Node) -> int | None:
    """The node's concat axis when the node can take part in a chain, else None."""
    axis = node.attrs.get("axis")
    rank = len(node.shape)
    if not isinstance(axis, int) or not -rank <= axis < rank or len(node.inputs) < 2 or \
            any(i < 0 for i in node.inputs):
        return None
    axis %= rank
    return axis if all(d == 1 for d in node.shape[:axis]) else None


def chains(graph: Subgraph) -> list[list[Node]]:
    """The subgraph's concat chains of two or more nodes, in execution order."""
    concats = {n.id: n for n in graph.ops if n.op == "concat" and _axis(n) is not None}
    extends: dict[int, list[Node]] = {}  # node id -> the concats taking it as their first input
    for n in concats.values():
        if n.inputs[0] not in n.inputs[1:]:
            extends.setdefault(n.inputs[0], []).append(n)
    result, seen = [], set()
    for n in graph.ops:
        if n.id not in concats or n.id in seen:
            continue
        chain, axis = [n], _axis(n)
        while len(extends.get(chain[-1].id, ())) == 1:
            prev, nxt = chain[-1], extends[chain[-1].id][0]
            if _axis(nxt) != axis or nxt.dtype != n.dtype or nxt.id in seen or nxt.shape[axis] <= prev.shape[axis] \
                    or nxt.shape[:axis] + nxt.shape[axis + 1:] != n.shape[:axis] + n.shape[axis + 1:]:
                break
            chain.append(nxt)
        seen.update(c.id for c in chain)
        if len(chain) > 1:
            result.append(chain)
    return result


def _kernel(node: Node, first: bool, prefix: int, final: tuple, fallback: Callable) -> Callable:
    """The chain's kernel for ``node``: ``prefix`` is the length (along the axis) of the first input's
    view when ``node`` is not the chain's first node."""
    ax = _axis(node)
    dtype = node.dtype
    rest = node.shape[:ax] + node.shape[ax + 1:]
    lead = (slice(None),) * ax

    def kernel(*inputs, axis):
        arrays = [np.asarray(x) for x in inputs]
        if any(a.dtype != dtype or a.ndim != len(final) or a.shape[:ax] + a.shape[ax + 1:] != rest
               for a in arrays):
            return fallback(*inputs, axis=axis)
        head = arrays[0]
        buf = head.base
        reuse = not first and isinstance(buf, np.ndarray) and buf.shape == final and buf.dtype == dtype \
            and head.shape[ax] == prefix and buf.flags.c_contiguous \
            and head.__array_interface__["data"][0] == buf.__array_interface__["data"][0]
        if reuse:
            start, todo = prefix, arrays[1:]
        else:
            buf, start, todo = np.empty(final, dtype), 0, arrays
        for a in todo:
            np.copyto(buf[lead + (slice(start, start + a.shape[ax]),)], a, casting="no")
            start += a.shape[ax]
        return buf if start == final[ax] else buf[lead + (slice(0, start),)]

    return kernel


def chain_kernels(graph: Subgraph, concat: Callable) -> dict[int, Callable]:
    """node id -> the in-place kernel for every concat in a chain (``concat``: the table's kernel, the
    fallback)."""
    kernels = {}
    for chain in chains(graph):
        final = chain[-1].shape
        axis = _axis(chain[0])
        for k, node in enumerate(chain):
            prefix = chain[k - 1].shape[axis] if k else 0
            kernels[node.id] = _kernel(node, k == 0, prefix, final, concat)
    return kernels
