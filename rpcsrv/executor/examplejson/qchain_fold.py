"""Consecutive planned int8 steps run as one step (``kernels/quant/qchain.py`` says why and how it runs them).

After the steps are planned, each maximal run of consecutive steps whose plans have a ``link`` (the int8
convs, QLinearAdd, QuantizeLinear, QLinearGlobalAveragePool, MaxPool of int8) is cut where a step's result is
read outside its part or is a subgraph output (then that step ends the part: its result is the part's), and
every part of two or more steps whose layouts link (each operand in a layout its step takes in place) becomes
one step: the node of its last step reading the part's inputs, a kernel that checks them once and makes one
``rpcsrv_qchain`` call.  A call whose inputs are not what the part was made for (shape, dtype, layout), or
after the compiled library was turned off, runs the part's own steps one by one, as without the fold.  Runs
with a step hook set (the debug executor, profiles, ``byoc compare``) take the steps one by one too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from .text import Node


def _link(kernel) -> Any:
    return getattr(kernel, "link", None)


def chain_steps(steps: list, nodes: dict, outputs, constants: dict) -> list:
    """``steps`` (the subgraph's planned steps) with its linkable runs made one step each."""
    from ..kernels.clib import compiled

    lib = compiled.library()
    if lib is None or not hasattr(lib, "rpcsrv_qchain"):
        return steps
    runs, current = [], []
    for k, step in enumerate(steps):
        node, kernel, _kattrs, key, _last, index, _drops = step
        if key is None and index == 0 and _link(kernel) is not None:
            current.append(k)
            continue
        runs.append(current)
        current = []
    runs.append(current)
    replaced: dict[int, tuple] = {}  # first step of a part -> (its last step, the part's step)
    for run in runs:
        for part in _parts(run, steps, outputs):
            if len(part) > 1:
                made = _chain([steps[k] for k in part], nodes, constants, lib)
                if made is not None:
                    replaced[part[0]] = (part[-1], made)
    if not replaced:
        return steps
    out, k = [], 0
    while k < len(steps):
        if k in replaced:
            k, made = replaced[k][0] + 1, replaced[k][1]
            out.append(made)
        else:
            out.append(steps[k])
            k += 1
    return out


def _parts(run: list[int], steps: list, outputs) -> list[list[int]]:
    """``run`` cut after each step whose result is read outside its part or is a subgraph output."""
    readers: dict[int, set] = {}
    for k, step in enumerate(steps):
        for i in step[0].inputs:
            readers.setdefault(i, set()).add(k)
    outputs = set(outputs)
    cuts: set[int] = set()
    while True:
        parts, part = [], []
        for k in run:
            part.append(k)
            if k in cuts:
                parts.append(part)
                part = []
        if part:
            parts.append(part)
        new = {k for p in parts for k in p[:-1]
               if steps[k][0].id in outputs or not readers.get(steps[k][0].id, set()) <= set(p)}
        if new <= cuts:
            return parts
        cuts |= new


def _chain(part: list, nodes: dict, constants: dict, lib) -> Optional[tuple]:
    """The one step of ``part`` (planned steps), or None when their layouts do not link."""
    from ..kernels.quant.qchain import Chain

    produced = {step[0].id for step in part}
    shapes: dict[int, tuple] = {}  # node ID -> (shape, dtype, layout)
    inputs: list[int] = []
    links, reads, writes = [], [], []
    for node, kernel, *_ in part:
        link_of = kernel.link
        keys, layouts = [], []
        for pos in range(len(node.inputs)):
            i = node.inputs[pos]
            if i in produced and i in shapes:
                keys.append(i)
                layouts.append(shapes[i][2])
            elif i not in constants and i >= 0:
                if i not in shapes:
                    inputs.append(i)
                    shapes[i] = (tuple(nodes[i].shape), np.dtype(nodes[i].dtype), "c")
                keys.append(i)
                layouts.append(shapes[i][2])
            else:
                keys.append(None)
                layouts.append(None)
        tensors = [p for p, key in enumerate(keys) if key is not None]
        link = link_of(tuple(layouts[p] for p in tensors))
        if link is None or tuple(tensors) != tuple(link.operands):
            return None
        links.append(link)
        reads.append(tuple(keys[p] for p in link.operands))
        writes.append(node.id)
        shapes[node.id] = (tuple(node.shape), np.dtype(node.dtype), link.out)
    last = part[-1][0]
    chain = Chain(lib, links, reads, writes, inputs, last.id, shapes)
    ready, state, originals = (lambda: state.get("lib") is lib), _state(), list(part)

    def int8_run(*xs):
        if ready() and chain.fits(xs):
            return chain(*xs)
        return _one_by_one(originals, dict(zip(inputs, xs)), constants, last.id)

    int8_run.chain = chain
    drops = tuple(d for step in part for d in step[6] if d not in produced)
    node = dataclasses.replace(last, inputs=tuple(inputs))
    return (node, int8_run, {}, None, True, 0, drops)


def _state() -> dict:
    from ..kernels.clib import compiled

    return compiled._state


def _one_by_one(part: list, values: dict, constants: dict, out: int) -> np.ndarray:
    """The part's steps run as themselves (inputs from ``values``, else the bound constants)."""
    for node, kernel, kattrs, *_ in part:
        values[node.id] = kernel(*[values[i] if i in values else constants.get(i) for i in node.inputs], **kattrs)
    return values[out]


__all__ = ["Node", "chain_steps"]
