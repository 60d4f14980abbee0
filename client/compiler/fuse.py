"""Activation patterns made one op on the graph IR, before partitioning (``simplify.simplify_inference``
runs them), and the graph-reading helpers the folds share.

* **SiLU**: ``Mul(x, Sigmoid(x))`` (EfficientNet's activation as PyTorch exports it) becomes ``Swish(x)``:
  one pass instead of two, and the partitioner fuses it into the Conv before it.
* **GELU, erf form**: PyTorch's export of ``F.gelu`` (BERT-class encoders, MiniLM) writes
  ``x * 0.5 * (1 + erf(x / sqrt 2))`` as five nodes, ``Div(x, sqrt 2)`` (or ``Mul(x, 1 / sqrt 2)``) → ``Erf``
  → ``Add(1)`` → ``Mul(x, .)`` → ``Mul(0.5)``, or with the half taken first, ``Mul(Mul(x, 0.5), .)``; each
  reads and writes the whole FFN activation.  They become one ``Gelu(x)`` (ONNX's op, exact form), which
  the board runs in one pass.  onnxruntime fuses the same patterns.

A pattern is rewritten only when each inner tensor is read by the next node alone and is no graph output,
the constants are one-element floats of the expected values, and ``x`` is floating point.  The last node of
the pattern becomes the fused op (its output name stays); the others are dropped.
"""

from __future__ import annotations

import math
from typing import Optional

from .onnx_import import ONNX_DOMAINS, Graph, Node

_FLOATS = ("float16", "float32", "float64")


def uses(graph: Graph) -> dict[str, int]:
    """Tensor name -> how many node inputs and graph outputs read it."""
    count: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                count[i] = count.get(i, 0) + 1
    for o in graph.outputs:
        count[o] = count.get(o, 0) + 1
    return count


def readers(graph: Graph) -> dict[str, list[Node]]:
    """Tensor name -> the nodes that read it (each once)."""
    out: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in set(n.inputs):
            out.setdefault(i, []).append(n)
    return out


def sole_reader(name: str, by_name: dict, counts: dict) -> Optional[Node]:
    """The one node that reads ``name``, once, when nothing else does (no graph output either)."""
    users = by_name.get(name, [])
    return users[0] if counts.get(name) == 1 and len(users) == 1 else None


def fuse_swish(graph: Graph) -> int:
    """``Mul(x, Sigmoid(x))`` becomes one ``Swish(x)`` node (the Sigmoid's output read by that Mul alone).
    Returns how many."""
    counts, by_name = uses(graph), readers(graph)
    drop, count = set(), 0
    for sig in graph.nodes:
        mul = sole_reader(sig.outputs[0], by_name, counts) if sig.op_type == "Sigmoid" and sig.outputs else None
        if mul is None or mul.op_type != "Mul" or sorted(mul.inputs) != sorted([sig.inputs[0], sig.outputs[0]]) \
                or {sig.domain, mul.domain} - set(ONNX_DOMAINS) or sig.outputs[0] in graph.outputs:
            continue
        info = graph.tensors.get(sig.inputs[0])
        if info is None or info.dtype not in _FLOATS:
            continue
        mul.op_type, mul.inputs, mul.attrs = "Swish", [sig.inputs[0]], {}
        drop.add(id(sig))
        count += 1
    graph.nodes[:] = [n for n in graph.nodes if id(n) not in drop]
    return count


def _scalar(graph: Graph, name: str) -> Optional[float]:
    """The value of a one-element floating-point constant, or None."""
    c = graph.constants.get(name)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 and c.dtype.kind == "f" else None


def _near(value: Optional[float], want: float) -> bool:
    return value is not None and abs(value - want) <= 1e-6 * want


def _other(node: Node, name: str) -> Optional[str]:
    """The other input of a two-input node that reads ``name`` once, or None."""
    if len(node.inputs) != 2 or node.inputs.count(name) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _onnx(node: Optional[Node], op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ONNX_DOMAINS and len(node.outputs) == 1


def _gelu_at(erf: Node, graph: Graph, producer: dict, counts: dict, by_name: dict) -> Optional[tuple]:
    """(x, the node that becomes Gelu, the nodes dropped) for the erf pattern around ``erf``, or None."""
    scale = producer.get(erf.inputs[0]) if erf.inputs else None
    if not (_onnx(scale, "Div") or _onnx(scale, "Mul")) or sole_reader(erf.inputs[0], by_name, counts) is not erf:
        return None
    if scale.op_type == "Div" and len(scale.inputs) == 2 and _near(_scalar(graph, scale.inputs[1]), math.sqrt(2)):
        x = scale.inputs[0]
    elif scale.op_type == "Mul" and any(_near(_scalar(graph, i), math.sqrt(0.5)) for i in scale.inputs):
        x = _other(scale, next(i for i in scale.inputs if _near(_scalar(graph, i), math.sqrt(0.5))))
    else:
        return None
    info = graph.tensors.get(x or "")
    add = sole_reader(erf.outputs[0], by_name, counts)
    if info is None or info.dtype not in _FLOATS or not _onnx(add, "Add") \
            or not _near(_scalar(graph, _other(add, erf.outputs[0]) or ""), 1.0):
        return None
    mul = sole_reader(add.outputs[0], by_name, counts)
    if not _onnx(mul, "Mul"):
        return None
    other = _other(mul, add.outputs[0])
    if other == x:  # x * (1 + erf), then * 0.5
        half = sole_reader(mul.outputs[0], by_name, counts)
        if _onnx(half, "Mul") and _near(_scalar(graph, _other(half, mul.outputs[0]) or ""), 0.5):
            return x, half, (scale, erf, add, mul)
        return None
    half = producer.get(other or "")  # (x * 0.5) * (1 + erf)
    if _onnx(half, "Mul") and sole_reader(other, by_name, counts) is mul and x in half.inputs \
            and _near(_scalar(graph, _other(half, x) or ""), 0.5):
        return x, mul, (scale, erf, add, half)
    return None


def fuse_gelu(graph: Graph) -> int:
    """GELU's erf pattern (module doc) becomes one ``Gelu(x)`` node.  Returns how many."""
    counts, by_name = uses(graph), readers(graph)
    producer = {o: n for n in graph.nodes for o in n.outputs}
    drop, count = set(), 0
    for erf in graph.nodes:
        if not _onnx(erf, "Erf") or id(erf) in drop:
            continue
        found = _gelu_at(erf, graph, producer, counts, by_name)
        if found is None or any(id(n) in drop for n in found[2]):
            continue
        x, last, dropped = found
        last.op_type, last.domain, last.inputs, last.attrs = "Gelu", "", [x], {}
        drop.update(id(n) for n in dropped)
        count += 1
    graph.nodes[:] = [n for n in graph.nodes if id(n) not in drop]
    return count
