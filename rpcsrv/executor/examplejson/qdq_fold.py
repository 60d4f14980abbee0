"""Quantized chains of a subgraph folded into int8 ops when its constants are bound (the executor's int8 path).

A library compiled from a QDQ model (onnxruntime's ``quantize_static`` in its QDQ format) holds float ops between
``dequantize_linear`` and ``quantize_linear``: run as written, every conv dequantizes its weights and its input,
computes in float32 and quantizes its result.  :func:`rpcsrv.loader.opset.qdq.fold_qdq` (the one declaration of
which chains become which int8 op, shared with the client's compiler) says which chains compute what one int8 op
computes; here its folds are applied to the subgraph: each chain's Q node becomes the int8 op (same ID, shape
and dtype, so ``byoc compare`` still pairs it with the model's tensor), the chain's other nodes and the DQ nodes
only it read go, and the constants the fold makes (an int32 bias, a zero point a DQ left out) join the bound
ones under new IDs.  The int8 ops then run on the compiled int8 kernels (``kernels/quant/``).

A library from ``quantize_dynamic`` holds, per MatMul by constant weights, ``dynamic_quantize_linear`` ->
``matmul_integer`` -> ``cast`` (to float) -> ``mul`` by the product of the two scales [-> ``add`` of a float
bias]; that chain is onnxruntime's ``DynamicQuantizeMatMul`` and becomes one ``dynamic_quantize_matmul``
(:func:`fold_dynamic`): the activations quantized and multiplied in one step, no int32 tensor written; a Relu that
alone reads it goes in as its ``activation`` (a transformer's feed-forward).

Ops whose attributes an int8 op cannot take are not offered to the fold (a conv with a fused activation other
than Relu/Clip, or reading a channel shuffle; a MatMul with the compiler's bias input).  Everything else stays as
it is.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping, Optional

import numpy as np

from ...loader.opset import node_problems
from ...loader.opset.qdq import QNode, fold_qdq
from .text import RUNTIME_ATTRS, Node, Subgraph, input_counts

#: the ops that start a fold (a graph without them is left alone at once)
QUANTIZED = frozenset({"dequantize_linear", "matmul_integer"})
F32 = np.dtype(np.float32)
#: the ops that only reshape their input (an elementwise op after them may go before them)
RESHAPES = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})


def _offered(node: Node) -> bool:
    """Whether a float op's attributes fit the int8 op a fold would make of it."""
    act = node.attrs.get("activation")
    if node.op == "conv" and (node.attrs.get("input_shuffle", 1) != 1 or act not in (None, "relu", "clip")):
        return False
    if node.op in ("add", "mul", "gemm") and act not in (None, "relu", "clip"):
        return False
    return not (node.op == "matmul" and (len(node.inputs) > 2 or act is not None))


def _qnodes(graph: Subgraph) -> tuple[list[QNode], list[list[Node]]]:
    """The subgraph's ops as the fold reads them: one QNode per op (a multi-output op's nodes, one per
    ``output_index``, make one), and the nodes of each."""
    groups: dict[tuple, list[Node]] = {}
    for node in graph.ops:
        attrs = {k: v for k, v in node.attrs.items() if k not in RUNTIME_ATTRS}
        groups.setdefault((node.op, node.inputs, json.dumps(attrs, sort_keys=True)), []).append(node)
    qnodes, members = [], []
    for (op, inputs, attrs), nodes in groups.items():
        outputs = [""] * (1 + max(n.attrs.get("output_index", 0) for n in nodes))
        for n in nodes:
            outputs[n.attrs.get("output_index", 0)] = _ref(n.id)
        offered = op if len(nodes) > 1 or _offered(nodes[0]) else f"{op}:not-offered"
        qnodes.append(QNode(offered, [_ref(i) for i in inputs], outputs, json.loads(attrs)))
        members.append(nodes)
    return qnodes, members


def _ref(node_id: int) -> str:
    return "" if node_id < 0 else f"#{node_id}"


def _id(ref: str) -> int:
    return int(ref[1:]) if ref else -1


def fold_quantized(graph: Subgraph, constants: Mapping[int, np.ndarray]) -> Optional[tuple[Subgraph, dict]]:
    """The subgraph with its quantized chains folded, and the new constants by node ID; None when nothing
    folds."""
    if not any(n.op in QUANTIZED for n in graph.ops):
        return None
    qnodes, members = _qnodes(graph)
    made: dict[str, np.ndarray] = {}
    next_id = [max(graph.nodes) + 1]

    def new_ref(hint: str, array: np.ndarray) -> str:
        ref = _ref(next_id[0])
        next_id[0] += 1
        made[ref] = np.asarray(array)
        return ref

    value = lambda ref: constants.get(_id(ref)) if ref and graph.nodes[_id(ref)].kind == "const" else None  # noqa: E731
    folds = fold_qdq(qnodes, value, keep=[_ref(i) for i in graph.outputs], new_ref=new_ref, opset=13)
    nodes = dict(graph.nodes)
    new_consts: dict[int, np.ndarray] = {}
    for ref, array in made.items():
        nid = _id(ref)
        nodes[nid] = Node("const", nid, tuple(array.shape), array.dtype, 0, name=f"int8_fold_{nid}")
        new_consts[nid] = array
    for fold in folds:
        for k in fold.replace[:-1] + fold.drop:
            for n in members[k]:
                del nodes[n.id]
        (q,) = members[fold.replace[-1]]
        inputs = tuple(_id(r) for r in fold.node.inputs)
        present = [i >= 0 for i in inputs]
        dtypes = [str(nodes[i].dtype) if i >= 0 else None for i in inputs]
        if node_problems(fold.node.op, fold.node.attrs, present, dtypes):
            return None  # the fold made an op the board refuses: keep the graph as written
        nodes[q.id] = dataclasses.replace(q, op=fold.node.op, inputs=inputs, attrs=dict(fold.node.attrs))
    folded = dataclasses.replace(graph, nodes=nodes, outputs=list(graph.outputs))
    dynamic = fold_dynamic(folded, {**constants, **new_consts})
    if dynamic is not None:
        folded = dynamic
    if not folds and dynamic is None:
        return None
    return folded, new_consts


def _const(graph: Subgraph, constants, nid: int) -> Optional[np.ndarray]:
    node = graph.nodes.get(nid)
    return constants.get(nid) if node is not None and node.kind == "const" else None


def fold_dynamic(graph: Subgraph, constants: Mapping[int, np.ndarray]) -> Optional[Subgraph]:
    """``dynamic_quantize_linear`` -> ``matmul_integer`` by constant weights -> ``cast`` -> ``mul`` by (a_scale *
    b_scale) [-> ``add`` of a constant float bias] [-> ``relu``] as one ``dynamic_quantize_matmul`` (the Relu as its
    ``activation``, the product's store taking max(0, y)); None when there is none."""
    ops = graph.ops
    readers = input_counts(ops)
    outputs = set(graph.outputs)
    by_id = {n.id: n for n in ops}
    sole = {}  # node ID -> its one reader (when it has exactly one and is no subgraph output)
    for n in ops:
        for i in set(n.inputs):
            if readers[i] == 1 and i not in outputs:
                sole[i] = n
    nodes, changed = dict(graph.nodes), False
    for mm in ops:
        if mm.op != "matmul_integer" or len(mm.inputs) != 4 or mm.id not in nodes:
            continue
        q, w, z, wz = mm.inputs
        dq = by_id.get(q)
        wconst, wzconst = _const(graph, constants, w), _const(graph, constants, wz)
        if dq is None or dq.op != "dynamic_quantize_linear" or dq.attrs.get("output_index", 0) != 0 or \
                wconst is None or wconst.ndim != 2 or wzconst is None:
            continue
        zn = by_id.get(z)
        cast = sole.get(mm.id)
        scale_mul = sole.get(cast.id) if cast is not None else None
        if zn is None or zn.op != dq.op or zn.inputs != dq.inputs or zn.attrs.get("output_index") != 2 or \
                cast is None or cast.op != "cast" or cast.dtype != F32 or scale_mul is None or scale_mul.op != "mul":
            continue
        other = [i for i in scale_mul.inputs if i != cast.id]
        prod = by_id.get(other[0]) if len(other) == 1 else None
        ws = _scale_product(prod, dq, graph, constants, by_id)
        if ws is None or ws.size not in (1, wconst.shape[1]):
            continue
        last, bias = scale_mul, None
        add = sole.get(scale_mul.id)
        fused = {}  # the bias Add's own Relu (the compiler's Add+Relu composite)
        if add is not None and add.op == "add" and (not add.attrs or dict(add.attrs) == {"activation": "relu"}):
            b = _const(graph, constants, [i for i in add.inputs if i != scale_mul.id][0]) \
                if len(add.inputs) == 2 else None
            if b is not None and b.dtype == F32 and b.shape == (wconst.shape[1],) and add.shape == scale_mul.shape:
                last, bias, fused = add, [i for i in add.inputs if i != scale_mul.id][0], dict(add.attrs)
        chain, attrs = [mm, cast, scale_mul] + ([last] if last is not scale_mul else []), fused
        relu, shaped = (None, None) if fused else (sole.get(last.id), None)
        if relu is not None and relu.op in RESHAPES and relu.dtype == F32:  # relu(reshape(y)) = reshape(relu(y))
            relu, shaped = sole.get(relu.id), relu
        if relu is not None and relu.op == "relu" and not relu.attrs and relu.dtype == F32:
            attrs = {"activation": "relu"}
            if shaped is None:
                chain, last = chain + [relu], relu
            else:  # the reshape takes the Relu's place (and ID), reading the product
                nodes.pop(shaped.id, None)
                nodes[relu.id] = dataclasses.replace(shaped, id=relu.id, line=relu.line)
        ws_id = next(i for i in prod.inputs if _const(graph, constants, i) is not None)
        inputs = (dq.inputs[0], w, ws_id, wz) + ((bias,) if bias is not None else ())
        for gone in chain[:-1]:
            nodes.pop(gone.id, None)
        nodes[last.id] = dataclasses.replace(last, op="dynamic_quantize_matmul", inputs=inputs, attrs=attrs)
        changed = True
    if not changed:
        return None
    while True:  # the scale products, then the quantizations, that nothing reads any more
        live = {i for n in nodes.values() if n.kind == "op" for i in n.inputs} | outputs
        dead = [n.id for n in nodes.values() if n.kind == "op" and n.op in ("mul", "dynamic_quantize_linear")
                and n.id not in live]
        if not dead:
            break
        for nid in dead:
            del nodes[nid]
    return dataclasses.replace(graph, nodes=nodes)


def _scale_product(prod: Optional[Node], dq: Node, graph: Subgraph, constants, by_id) -> Optional[np.ndarray]:
    """The weight scale of ``mul(a_scale, w_scale)``, a_scale being ``dq``'s second output, or None."""
    if prod is None or prod.op != "mul" or len(prod.inputs) != 2:
        return None
    for a, b in (prod.inputs, prod.inputs[::-1]):
        an, ws = by_id.get(a), _const(graph, constants, b)
        if an is not None and an.op == dq.op and an.inputs == dq.inputs and an.attrs.get("output_index") == 1 and \
                ws is not None and ws.dtype == F32 and ws.ndim <= 1:
            return ws
    return None
