"""Work on constant weights done when a subgraph's constants are bound, not in the first run.

Some kernels derive data from their weights once and cache it (the fast convolution paths of
``conv.FAST_PATHS``: Winograd's transformed weights, the stacked taps; cached by ``prepared.py``).
Done lazily, that work lands on the first run after ``load_module``: on VGG-19 the transforms alone
were ~60% of a first run that took ~3x the steady state (a first run should take at most 3x).
``prepare_constants`` walks a subgraph once its constants are bound and does that work for every op
whose prepared data depends only on constants and declared shapes, so the first run finds it ready.
It changes no result: a kernel whose data was not prepared here computes it on first use, as before.
(The depthwise weight vectors, also cached by ``prepared.py``, are small and stay lazy.)

A table, like the kernels': op name -> ``prepare(args, constant, kernel_attrs)``, where ``args`` holds
the op's inputs as bound constants or, for computed inputs, zero-stride stand-ins of the declared shape
and dtype (no memory), so a kernel's own "would I take this path" test can be asked as is; ``constant``
says which are which.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .conv.conv import fast_path
from .windows import spatial_attr


def _prepare_conv(args: list, constant: list[bool], attrs: Mapping[str, Any]) -> None:
    """The derived weights of the fast path ``conv`` will take for this layer (``conv.fast_path``)."""
    if len(args) < 2 or not constant[1] or args[0] is None or args[0].ndim < 3:
        return
    x, w = args[0], args[1]
    k = x.ndim - 2
    if w.ndim != x.ndim:
        return
    try:  # the attributes as conv reads them (a bad one is conv's to report, at the run)
        strides = spatial_attr(attrs.get("strides"), k, 1, "strides", "conv")
        dilations = spatial_attr(attrs.get("dilations"), k, 1, "dilations", "conv")
    except (ValueError, TypeError):
        return
    path = fast_path(x, w, strides, dilations, int(attrs.get("group", 1)))
    if path is not None:
        path.prepare(w)


#: op -> prepare function
PREPARE: dict[str, Callable[..., None]] = {"conv": _prepare_conv}


def prepare_constants(ops: list, nodes: Mapping[int, Any], constants: Mapping[int, np.ndarray],
                      kernel_attrs: list[Mapping[str, Any]]) -> int:
    """Prepare what the ``ops`` (in order, with their kernel attributes) derive from the bound
    ``constants`` (node ID -> array); returns how many ops were asked."""
    asked = 0
    for node, attrs in zip(ops, kernel_attrs):
        prepare = PREPARE.get(node.op)
        if prepare is None or not any(i in constants for i in node.inputs):
            continue
        args, constant = [], []
        for i in node.inputs:
            constant.append(i in constants)
            if i in constants:
                args.append(constants[i])
            elif i in nodes:  # a computed input: its declared shape, no memory
                args.append(np.broadcast_to(np.zeros((), dtype=nodes[i].dtype), nodes[i].shape))
            else:  # an omitted optional input
                args.append(None)
        prepare(args, constant, attrs)
        asked += 1
    return asked
