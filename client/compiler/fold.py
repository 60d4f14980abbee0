"""Constant folding on the ONNX model, so that shape computations become static.

Exported models often compute shapes at run time (``Shape → Gather → Concat → Reshape``, ``Range``
over a size, ``ConstantOfShape``).  With concrete input shapes those values are known when
compiling, as TVM's ``FoldConstant`` and static-shape passes know them.  One round:

* ``Constant`` nodes become initializers;
* ``Shape`` and ``Size`` of a tensor with a static shape become constants;
* a node of an op the board has (the op catalogue ``rpcsrv.loader.opset``) whose inputs are all
  constants is evaluated with ONNX's reference implementation (``onnx.reference``, at the model's
  opset: the semantics the board's kernels are tested against) and its outputs become initializers.
  The client does not run the board's kernels itself: it may import only the library formats.
  ``DequantizeLinear`` is not folded (:data:`KEEP`): a quantized weight stays int8 behind its DQ, which
  the QDQ fold (``quantize``) then takes into the int8 op.

The importer alternates shape inference and folding until nothing changes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx.reference import ReferenceEvaluator

from rpcsrv.loader.opset import OPS, onnx_op_to_kernel

ONNX_DOMAINS = ("", "ai.onnx")
#: refuse to fold into constants larger than this (bytes): they would bloat the library
MAX_FOLDED_BYTES = 16 << 20
#: ops never folded, though their inputs are constant: a DQ of int8 weights belongs to its QDQ chain
KEEP = frozenset({"DequantizeLinear"})


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and \
                all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
    return shapes


def attr_value(attr: onnx.AttributeProto):
    """An ONNX attribute as a JSON-able value; None for kinds JSON cannot hold (graphs, ...).

    Strings are decoded; a tensor becomes a (nested) list of its values, which loses its dtype.
    """
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value).tolist()
    if isinstance(value, list):
        if value and isinstance(value[0], bytes):
            return [v.decode("utf-8", "replace") for v in value]
        return list(value) if all(isinstance(v, (int, float)) for v in value) else None
    return value if isinstance(value, (int, float)) else None


def _attrs(node: onnx.NodeProto) -> dict | None:
    values = {a.name: attr_value(a) for a in node.attribute}
    return None if any(v is None for v in values.values()) else values


def _shape_of(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return np.array(shape[start:end], dtype=np.int64)


def _single_node_graph(node: onnx.NodeProto) -> onnx.GraphProto:
    """``node`` alone in a graph: ``ReferenceEvaluator`` honours ``opsets`` for a graph, while for a bare
    node it takes the newest opset (so e.g. Unsqueeze-1's ``axes`` attribute was refused by Unsqueeze-13)."""
    return helper.make_graph([node], "fold", [helper.make_empty_tensor_value_info(i) for i in node.input if i],
                             [helper.make_empty_tensor_value_info(o) for o in node.output if o])


def _evaluate(node: onnx.NodeProto, consts: dict, shapes: dict, opsets: dict) -> list | None:
    """The node's output values when they are known now, else None."""
    if node.domain not in ONNX_DOMAINS or node.op_type in KEEP:
        return None
    if node.op_type == "Constant":
        a = node.attribute[0]
        v = helper.get_attribute_value(a)
        return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)]
    if node.op_type in ("Shape", "Size") and node.input[0] in shapes:
        shape = shapes[node.input[0]]
        if node.op_type == "Size":
            return [np.array(math.prod(shape), dtype=np.int64)]
        return [_shape_of(node, shape)]
    if not node.input or any(i and i not in consts for i in node.input):
        return None
    if onnx_op_to_kernel(node.op_type) not in OPS or _attrs(node) is None:
        return None
    try:
        with np.errstate(all="ignore"):
            evaluator = ReferenceEvaluator(_single_node_graph(node), opsets=opsets)
            values = evaluator.run(None, {i: consts[i] for i in node.input if i})
    except Exception:
        return None  # leave it to the board: the error shows up where it runs
    return [np.asarray(v) for v in values]


def fold_constants(model: onnx.ModelProto) -> bool:
    """One folding round over ``model`` (changed in place); True when anything was folded."""
    graph = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    shapes = _static_shapes(graph)
    opsets = {"": max([o.version for o in model.opset_import if o.domain in ONNX_DOMAINS] or [1])}
    keep, changed = [], False
    for node in graph.node:
        values = _evaluate(node, consts, shapes, opsets)
        outs = [o for o in node.output if o]
        if values is None or len(values) < len(outs) or \
                sum(v.nbytes for v in values) > MAX_FOLDED_BYTES:
            keep.append(node)
            continue
        try:
            tensors = [numpy_helper.from_array(v, n) for n, v in zip(node.output, values) if n]
        except Exception:  # a dtype ONNX cannot hold as a tensor: keep the node
            keep.append(node)
            continue
        for t in tensors:
            consts[t.name] = numpy_helper.to_array(t)
        graph.initializer.extend(tensors)
        changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(keep)
        folded = {t.name for t in graph.initializer}
        kept_vi = [vi for vi in graph.value_info if vi.name not in folded]
        del graph.value_info[:]
        graph.value_info.extend(kept_vi)
    return changed
