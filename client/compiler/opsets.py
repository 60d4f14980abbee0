"""Nodes of older ONNX opsets, rewritten to the current semantics the board's kernels implement.

A model imports one default-domain opset (1 to the newest ``onnx`` knows); each node then follows the
newest version of its op at or below that opset (``onnx.defs.get_schema(op, opset).since_version``).
The kernels implement the current versions (plus a few old attributes they accept directly, such as
Clip's ``min``/``max`` or the Reduce ops' ``axes``).  This module rewrites, on the graph IR with its
static shapes, what changed meaning:

* ``consumed_inputs`` (opset 1, many ops): an in-place hint, dropped;
* legacy broadcasting (``broadcast``/``axis``, opsets < 7, binary ops and Gemm): ``B`` is aligned
  with ``A`` starting at ``axis``, so ``B`` gets trailing 1-dims (numpy's suffix alignment then agrees);
* Softmax / LogSoftmax / Hardmax (< 13): the input is seen as 2-D, split at ``axis`` (default 1):
  Flatten → op along axis 1 → Reshape back, unless ``axis`` is already the last one;
* Reshape (< 5): the ``shape`` attribute becomes a constant input;
* Concat (< 4): ``axis`` defaults to 1;
* Pad (1): ``paddings`` is ``pads``;
* Cast (< 6): ``to`` is a type name (``"FLOAT"``), now its number;
* PRelu (< 7): a 1-D slope of the channel count applies per channel (axis 1);
* TopK (< 10): ``k`` is an attribute, now an input;
* BatchNormalization (< 9) with ``spatial=0``: per-activation statistics, computed as ``x * s + t``
  with folded constants (Mul, Add);
* Upsample (1): ``height_scale``/``width_scale`` are ``scales``;
* Resize (10): asymmetric coordinates and nearest rounding down (Resize 11's attributes say so);
* Scatter (< 11, deprecated): ScatterElements under its old name.

Dropout and BatchNormalization of old opsets also have outputs (mask, running statistics) that
inference never reads; ``onnx_import`` drops unread optional outputs before this runs.
"""

from __future__ import annotations

import numpy as np
import onnx

from .errors import CompileError
from .ir import Graph, Node, TensorInfo

LEGACY_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"}


def since_version(node: Node, opset: int) -> int:
    """The version of ``node``'s op that opset ``opset`` uses (0 when onnx does not know the op)."""
    try:
        return onnx.defs.get_schema(node.op_type, opset, "").since_version
    except Exception:
        return 0


class _Rewriter:
    """Adds constants, tensors and nodes to ``graph`` with fresh names."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.taken = set(graph.tensors) | set(graph.constants) | {o for n in graph.nodes for o in n.outputs}

    def name(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def constant(self, base: str, value) -> str:
        value = np.asarray(value)
        name = self.name(base)
        self.graph.constants[name] = value
        self.graph.tensors[name] = TensorInfo(tuple(value.shape), value.dtype.name)
        return name

    def tensor(self, base: str, shape, dtype: str) -> str:
        name = self.name(base)
        self.graph.tensors[name] = TensorInfo(tuple(shape), dtype)
        return name


def _legacy_broadcast(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    broadcast, axis = node.attrs.pop("broadcast", 0), node.attrs.pop("axis", None)
    if node.op_type == "Gemm" or not broadcast or axis is None or len(node.inputs) != 2:
        return
    a, b = (rw.graph.tensors[t] for t in node.inputs)
    start = axis + len(a.shape) if axis < 0 else axis
    trailing = len(a.shape) - start - len(b.shape)
    if trailing <= 0:
        return
    shape = tuple(b.shape) + (1,) * trailing
    src = node.inputs[1]
    if src in rw.graph.constants:
        node.inputs[1] = rw.constant(f"{src}__aligned", rw.graph.constants[src].reshape(shape))
        return
    aligned = rw.tensor(f"{src}__aligned", shape, b.dtype)
    target = rw.constant(f"{src}__aligned_shape", np.array(shape, dtype=np.int64))
    out.append(Node(f"{node.name}__align", "Reshape", "", [src, target], [aligned], {}))
    node.inputs[1] = aligned


def _softmax(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    x = rw.graph.tensors[node.inputs[0]]
    rank = len(x.shape)
    axis = node.attrs.get("axis", 1)
    axis = axis + rank if axis < 0 else axis
    if axis >= rank - 1 or rank == 0:
        node.attrs["axis"] = -1
        return
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = rw.tensor(f"{node.inputs[0]}__2d", (rows, int(np.prod(x.shape[axis:], dtype=np.int64))), x.dtype)
    out.append(Node(f"{node.name}__flatten", "Flatten", "", [node.inputs[0]], [flat], {"axis": axis}))
    result = node.outputs[0]
    flat_out = rw.tensor(f"{result}__2d", rw.graph.tensors[flat].shape, x.dtype)
    node.inputs, node.outputs, node.attrs = [flat], [flat_out], {"axis": -1}
    out.append(node)
    shape = rw.constant(f"{result}__shape", np.array(x.shape, dtype=np.int64))
    out.append(Node(f"{node.name}__unflatten", "Reshape", "", [flat_out, shape], [result], {}))


def _reshape(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    if "shape" in node.attrs:
        shape = np.array(node.attrs.pop("shape"), dtype=np.int64)
        node.inputs = [node.inputs[0], rw.constant(f"{node.name}__shape", shape)]


def _cast(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    to = node.attrs.get("to")
    if isinstance(to, (str, bytes)):
        label = to.decode() if isinstance(to, bytes) else to
        try:
            node.attrs["to"] = onnx.TensorProto.DataType.Value(label.upper())
        except ValueError:
            raise CompileError(f"node {node.name!r} (Cast): unknown type name {label!r}") from None


def _prelu(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    x, slope = (rw.graph.tensors[t] for t in node.inputs)
    if len(x.shape) > 2 and slope.shape == (x.shape[1],) and x.shape[1] != x.shape[-1]:
        shape = (x.shape[1],) + (1,) * (len(x.shape) - 2)
        src = node.inputs[1]
        if src in rw.graph.constants:
            node.inputs[1] = rw.constant(f"{src}__per_channel", rw.graph.constants[src].reshape(shape))
        else:
            aligned = rw.tensor(f"{src}__per_channel", shape, slope.dtype)
            target = rw.constant(f"{src}__per_channel_shape", np.array(shape, dtype=np.int64))
            out.append(Node(f"{node.name}__align", "Reshape", "", [src, target], [aligned], {}))
            node.inputs[1] = aligned


def _top_k(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    if "k" in node.attrs:
        node.inputs = [node.inputs[0], rw.constant(f"{node.name}__k", np.array([node.attrs.pop("k")], np.int64))]


def _batch_norm(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    if node.attrs.get("spatial", 1) or not node.attrs.get("is_test", 1):
        return  # spatial=1 is today's meaning; training mode stays for the kernel to refuse
    if not all(t in rw.graph.constants for t in node.inputs[1:5]):
        raise CompileError(f"node {node.name!r} (BatchNormalization spatial=0) needs constant scale, B, "
                           f"mean and var")
    scale, b, mean, var = (rw.graph.constants[t].astype(np.float64) for t in node.inputs[1:5])
    dtype = rw.graph.constants[node.inputs[1]].dtype
    s = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    t = b - mean * s
    scaled = rw.tensor(f"{node.outputs[0]}__scaled", rw.graph.tensors[node.inputs[0]].shape,
                       rw.graph.tensors[node.inputs[0]].dtype)
    out.append(Node(f"{node.name}__mul", "Mul", "", [node.inputs[0], rw.constant(f"{node.name}__s", s.astype(dtype))],
                    [scaled], {}))
    out.append(Node(f"{node.name}__add", "Add", "", [scaled, rw.constant(f"{node.name}__t", t.astype(dtype))],
                    [node.outputs[0]], {}))
    node.op_type = ""  # replaced


def _upsample(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    if "height_scale" in node.attrs or "width_scale" in node.attrs:
        h, w = node.attrs.pop("height_scale", 1.0), node.attrs.pop("width_scale", 1.0)
        node.attrs["scales"] = [1.0, 1.0, float(h), float(w)]


def _resize_10(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    node.attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    node.inputs = [node.inputs[0], "", node.inputs[1]]


def _rename(new_type: str):
    def rename(node: Node, rw: _Rewriter, out: list[Node]) -> None:
        node.op_type = new_type
    return rename


def _pad(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    if "paddings" in node.attrs:
        node.attrs["pads"] = node.attrs.pop("paddings")


def _concat(node: Node, rw: _Rewriter, out: list[Node]) -> None:
    node.attrs.setdefault("axis", 1)


#: op type -> [(versions below this one are rewritten, rewrite)]
REWRITES = {
    "Softmax": [(13, _softmax)], "LogSoftmax": [(13, _softmax)], "Hardmax": [(13, _softmax)],
    "Reshape": [(5, _reshape)], "Concat": [(4, _concat)], "Pad": [(2, _pad)], "Cast": [(6, _cast)],
    "PRelu": [(7, _prelu)], "TopK": [(10, _top_k)], "BatchNormalization": [(9, _batch_norm)],
    "Upsample": [(7, _upsample)], "Resize": [(11, _resize_10)], "Scatter": [(12, _rename("ScatterElements"))],
    "Gemm": [(7, _legacy_broadcast)],
    **{op: [(7, _legacy_broadcast)] for op in LEGACY_BROADCAST},
}


def upgrade_nodes(graph: Graph) -> int:
    """Rewrite old-opset nodes of ``graph`` in place; returns how many nodes were rewritten.

    Each rewrite edits the node and may put new nodes into ``out``, in execution order, with the node
    itself where it belongs among them (when it is not there, it is placed last; a rewrite that
    replaces the node clears its ``op_type``).
    """
    rw = _Rewriter(graph)
    nodes: list[Node] = []
    changed = 0
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        version = since_version(node, graph.opset)
        before = (node.op_type, dict(node.attrs), list(node.inputs))
        node.attrs.pop("consumed_inputs", None)
        out: list[Node] = []
        for below, rewrite in REWRITES.get(node.op_type, ()):
            if version and version < below:
                rewrite(node, rw, out)
        if node.op_type and all(n is not node for n in out):
            out.append(node)
        nodes.extend(n for n in out if n.op_type)
        changed += (node.op_type, node.attrs, node.inputs) != before or len(out) != 1
    graph.nodes = nodes
    return changed
