"""Branches written straight into their Concat's buffer (SqueezeNet's Fire modules, Inception's branches).

A Fire module ends in ``concat(relu(conv1x1(s)), relu(conv3x3(s)))`` along the channels; with one image (only
1s before the axis) each input of the Concat is one contiguous block of its output.  Instead of each branch
writing its own array that the Concat then copies, the branch that runs first (the *owner*) allocates the
Concat's buffer, once per call, and each folded branch writes its result into its slice (a view): through its
plan's ``out=`` where the plan has one (``fn.into``: the plan then returns ``out`` itself), else by computing
its result and copying it into the slice.  The Concat returns the buffer, after copying in any input that is
not folded (a graph input, a tensor with other readers).

A producer is folded when it is an op step of the subgraph read by that Concat alone (once), not a subgraph
output, not a concat (DenseNet's chains are ``concat_chain``'s), one output (no ``output_index``) and no other
step with its op, inputs and attributes (those run once, shared), of the Concat's dtype and of its shape but
along the axis.  The later producers read the owner's view as one more input, to reach the buffer
(``view.base``), so the run's own order and drops carry the buffer from the owner to the Concat.

Why the views stay right: kernels never write their inputs, each slice is written only by its producer and
before the Concat runs, and each call allocates its own buffer, so calls from several threads do not share
one.  Whenever a producer or the Concat does not receive what the fold arranged (a kernel result of another
shape or dtype, a view of another buffer), it falls back: the producer's own result (the run then reports
the mismatch as before), the Concat's own kernel on its inputs.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Callable

import numpy as np

from .concat_chain import _axis, chains
from .text import Node, RUNTIME_ATTRS, Subgraph, input_counts

#: ``SWITCH["on"] = False``: subgraph functions made after it keep their Concats as they are (paired benchmarks)
SWITCH = {"on": True}


@dataclasses.dataclass(frozen=True)
class Into:
    """Where a folded producer writes: ``node`` as declared (its plan is made for these inputs), the slice
    ``index`` of the Concat's buffer of ``final`` shape and ``dtype``; ``owner``: it allocates the buffer, else
    it reads the view of ``owner_id`` (the owner) as its last input."""

    node: Node
    index: tuple
    final: tuple
    dtype: np.dtype
    owner_id: int

    @property
    def owner(self) -> bool:
        return self.owner_id == self.node.id

    def wrap(self, fn: Callable) -> Callable:
        """The step's kernel: ``fn`` (a plan, or the table kernel with its attributes) writing into the slice."""
        index, final, dtype, into = self.index, self.final, self.dtype, getattr(fn, "into", False)

        def write(view, args, kattrs):
            result = fn(*args, out=view, **kattrs) if into else fn(*args, **kattrs)
            if result is view:
                return view
            if type(result) is np.ndarray and result.shape == view.shape and result.dtype == dtype:
                np.copyto(view, result, casting="no")
                return view
            return result  # not what the node declares: the run reports it

        if self.owner:
            def owner_into(*args, **kattrs):
                return write(np.empty(final, dtype)[index], args, kattrs)

            owner_into.inner = fn
            return owner_into

        def into_concat(*args, **kattrs):
            buf = getattr(args[-1], "base", None)
            if type(buf) is not np.ndarray or buf.shape != final or buf.dtype != dtype:
                return fn(*args[:-1], **kattrs)  # not the owner's view (it returned its own result): no fold
            return write(buf[index], args[:-1], kattrs)

        into_concat.inner = fn
        return into_concat


def _key(node: Node) -> tuple:
    return node.op, node.inputs, json.dumps({k: v for k, v in node.attrs.items() if k not in RUNTIME_ATTRS},
                                            sort_keys=True)


def fold_concats(graph: Subgraph, ops: list[Node], concat: Callable, claimed=frozenset()) -> \
        tuple[list[Node], dict[int, Into], dict[int, Callable]]:
    """``ops`` with the later producers of each foldable Concat reading the owner's output as one more input;
    the producers' :class:`Into` by node ID; the Concats' kernels by node ID (``concat``: the table's kernel,
    the fallback).  ``claimed``: IDs of Concats another rewrite gives its own kernel (left alone)."""
    if not SWITCH["on"]:
        return ops, {}, {}
    readers = input_counts(ops)
    keys = Counter(_key(node) for node in ops)
    in_chain = {n.id for chain in chains(graph) for n in chain}
    outputs, by_id, place = set(graph.outputs), {n.id: n for n in ops}, {n.id: k for k, n in enumerate(ops)}
    intos: dict[int, Into] = {}
    kernels: dict[int, Callable] = {}
    for cat in ops:
        if cat.op != "concat" or cat.id in in_chain or cat.id in claimed or set(cat.attrs) - {"axis"}:
            continue
        ax = _axis(cat)
        if ax is None:
            continue
        lead, start, slots = (slice(None),) * ax, 0, []
        for i in cat.inputs:
            src = by_id.get(i) or graph.nodes.get(i)
            if src is None or len(src.shape) != len(cat.shape) or src.dtype != cat.dtype \
                    or src.shape[:ax] + src.shape[ax + 1:] != cat.shape[:ax] + cat.shape[ax + 1:]:
                slots = None
                break
            slots.append((i, lead + (slice(start, start + src.shape[ax]),)))
            start += src.shape[ax]
        if slots is None or start != cat.shape[ax]:
            continue
        folded = [(i, index) for i, index in slots
                  if i in by_id and readers.get(i) == 1 and i not in outputs and i not in in_chain
                  and by_id[i].op != "concat" and "output_index" not in by_id[i].attrs
                  and keys[_key(by_id[i])] == 1 and place[i] < place[cat.id]]
        if not folded:
            continue
        owner = min((i for i, _ in folded), key=place.get)
        for i, index in folded:
            intos[i] = Into(by_id[i], index, cat.shape, cat.dtype, owner)
        kernels[cat.id] = _concat_kernel(cat, slots, {i for i, _ in folded}, owner, concat)
    rewritten = [dataclasses.replace(n, inputs=n.inputs + (intos[n.id].owner_id,))
                 if n.id in intos and not intos[n.id].owner else n for n in ops]
    return rewritten, intos, kernels


def _concat_kernel(cat: Node, slots: list, folded: set, owner: int, concat: Callable) -> Callable:
    """The Concat's kernel: the owner's buffer, with the inputs not folded copied into their slices."""
    final, dtype = cat.shape, cat.dtype
    pos = [k for k, (i, _) in enumerate(slots) if i == owner][0]
    checks = [k for k, (i, _) in enumerate(slots) if i in folded and i != owner]
    copies = [(k, index) for k, (i, index) in enumerate(slots) if i not in folded]

    def concat_into(*inputs, axis):
        buf = getattr(inputs[pos], "base", None) if len(inputs) == len(slots) else None
        if type(buf) is not np.ndarray or buf.shape != final or buf.dtype != dtype \
                or any(getattr(inputs[k], "base", None) is not buf for k in checks):
            return concat(*inputs, axis=axis)
        for k, index in copies:
            view = buf[index]
            if type(inputs[k]) is not np.ndarray or inputs[k].shape != view.shape or inputs[k].dtype != dtype:
                return concat(*inputs, axis=axis)
            np.copyto(view, inputs[k], casting="no")
        return buf

    return concat_into
