"""int8 as first-class ops of the compiler's IR: QDQ chains folded, zero points written, tensors annotated.

onnxruntime's quantizer writes a quantized model two ways, and both become the same IR here:

* **QDQ**: float ops between ``DequantizeLinear`` and ``QuantizeLinear``.  :func:`fold_chains` runs the op
  language's one declaration of the chains (``rpcsrv.loader.opset.qdq.fold_qdq``) over the graph and puts
  each chain's int8 op in its place: DQ -> Conv [-> bias] [-> Relu | Clip] -> Q is one ``QLinearConv``
  (a fused activation is its ``activation`` attribute: a clamp of the int8 output), DQ -> Gemm -> Q a
  ``com.microsoft`` ``QGemm``, DQ -> Add -> Q a ``QLinearAdd``, ...; DQ -> MaxPool / Reshape / ... -> Q
  with the same parameters the op itself on the integers.  What does not fold keeps its DQ and Q nodes.
* **QOperator**: ``QLinearConv``, ``QLinearMatMul`` and the ``com.microsoft`` ``QLinear*`` ops, as written.

Then :func:`normalize_zero_points` writes the 0 constant (of the operand's type) for every zero point an
int8 op leaves out, so that each int8 op has all its scales and zero points as constant inputs, and
:func:`annotate_tensors` sets ``TensorInfo.quant`` of each quantized tensor those ops read and write
(and of what MaxPool, Reshape, ... make of them on the integers).  :func:`op_quant` gives a partitioned
op's parameters by role, ``Op.quant``: what a codegen receives (``docs/plugins.md``, "int8").

Op-set names (``--ops``, a codegen's ``ops``) name the op language's ops; :func:`with_int8_forms` lets a
float op's name cover its int8 forms (``conv`` -> ``q_linear_conv``, ``conv_integer``; ``gemm`` ->
``q_gemm``; ``matmul`` -> ``q_linear_matmul``, ...: the fold's table ``qdq.FOLDS``), so ``--ops conv``
offloads the int8 convolutions of a quantized model as it offloads the float ones of a float model.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from rpcsrv.loader.opset import onnx_op_to_kernel
from rpcsrv.loader.opset.qdq import FOLDS, PASS_THROUGH, QNode, fold_qdq
from rpcsrv.loader.opset.quant import QTYPES, QUANT_ROLES, QuantParams, role_slots, roles

from .contrib_shapes import MS_DOMAIN, SURROGATES
from .ir import Graph, Node
from .opsets import _Rewriter

#: the domains whose ops the op language names (``onnx_op_to_kernel`` of the op type)
OP_DOMAINS = ("", "ai.onnx", MS_DOMAIN)
#: the int8 ops of the op language as ONNX nodes: kernel name -> (op type, domain); the com.microsoft ones
#: are those whose shapes ``contrib_shapes`` infers
INT8_NODES = {onnx_op_to_kernel(t): (t, "") for t in (
    "QLinearConv", "QLinearMatMul", "QuantizeLinear", "DequantizeLinear", "ConvInteger", "MatMulInteger",
    "DynamicQuantizeLinear")}
INT8_NODES.update({onnx_op_to_kernel(t): (t, MS_DOMAIN) for t in SURROGATES})
#: integer ops that are no fold of a float op, by the float op whose name covers them
_INTEGER = {"conv": ("conv_integer",), "matmul": ("matmul_integer", "matmul_integer_to_float",
                                                 "dynamic_quantize_matmul")}


def kernel_of(node: Node) -> str:
    """The op language's name for ``node`` ("" for a domain it does not cover)."""
    return onnx_op_to_kernel(node.op_type) if node.domain in OP_DOMAINS else ""


def int8_forms(name: str) -> set[str]:
    """The int8 ops the op name ``name`` also covers (``conv`` -> ``{q_linear_conv, conv_integer}``)."""
    return ({FOLDS[name]} if name in FOLDS else set()) | set(_INTEGER.get(name, ()))


def with_int8_forms(names: Iterable[str], have: Iterable[str]) -> frozenset:
    """``names`` and the int8 forms each covers, where ``have`` (a codegen's op set) has them."""
    have = frozenset(have)
    return frozenset(set(names) | {f for n in names for f in int8_forms(n) if f in have})


# -------------------------------------------------------------------------------------- the fold

def fold_chains(graph: Graph) -> int:
    """Fold the graph's QDQ chains into int8 ops in place (module doc); returns how many."""
    rw = _Rewriter(graph)
    qnodes = [QNode(kernel_of(n), n.inputs, n.outputs, n.attrs) for n in graph.nodes]

    def new_ref(hint: str, array: np.ndarray) -> str:
        return rw.constant(f"{hint}__q", array)

    folds = fold_qdq(qnodes, graph.constants.get, keep=graph.outputs, new_ref=new_ref, opset=graph.opset or 13)
    if not folds:
        return 0
    gone = {k for f in folds for k in f.replace[:-1] + f.drop}
    at = {f.replace[-1]: f for f in folds}
    nodes = []
    for k, n in enumerate(graph.nodes):
        if k in gone:
            continue
        fold = at.get(k)
        if fold is None:
            nodes.append(n)
            continue
        first = graph.nodes[fold.replace[0]]
        op_type, domain = INT8_NODES.get(fold.node.op, (first.op_type, first.domain))
        nodes.append(Node(first.name, op_type, domain, list(fold.node.inputs), list(fold.node.outputs),
                          dict(fold.node.attrs)))
    graph.nodes = nodes
    return len(folds)


# -------------------------------------------------------------------------------------- zero points

def normalize_zero_points(graph: Graph) -> int:
    """Write the 0 constant of its tensor's type for each zero point an int8 op leaves out (where its
    scale is given); returns how many were written."""
    rw = _Rewriter(graph)
    written = 0
    for node in graph.nodes:
        kernel = kernel_of(node)
        for role, (data, scale, zp, _axis) in role_slots(kernel, len(node.inputs)).items():
            if scale >= len(node.inputs) or not node.inputs[scale]:
                continue
            if zp < len(node.inputs) and node.inputs[zp]:
                continue
            tensor = node.outputs[0] if data is None else node.inputs[data]
            info = graph.tensors.get(tensor)
            if info is None or np.dtype(info.dtype) not in QTYPES:
                continue
            while len(node.inputs) <= zp:
                node.inputs.append("")
            shape = graph.tensors[node.inputs[scale]].shape if node.inputs[scale] in graph.tensors else ()
            node.inputs[zp] = rw.constant(f"{node.name}__{role}_zero_point", np.zeros(shape, info.dtype))
            written += 1
    return written


# -------------------------------------------------------------------------------------- parameters

def node_quant(kernel: str, inputs, attrs, graph: Graph) -> dict[str, QuantParams]:
    """The quantization parameters of an int8 op by role (``roles`` of the op language), {} for others."""
    if kernel not in QUANT_ROLES:
        return {}

    def dtype(ref):
        info = graph.tensors.get(ref)
        return np.dtype(info.dtype) if info is not None else None

    try:
        return roles(kernel, list(inputs), attrs, graph.constants.get, dtype)
    except ValueError:
        return {}  # parameters no QuantParams holds (blocked, ...): the op's own checks say so


def op_quant(op, graph: Graph) -> dict[str, QuantParams]:
    """``Op.quant`` for a partitioned op (its kernel's roles over its inputs)."""
    return node_quant(op.kernel, op.inputs, op.attrs, graph)


def annotate_tensors(graph: Graph) -> None:
    """Set ``TensorInfo.quant`` of every tensor an int8 op reads or writes as a quantized tensor, and of
    the outputs of ops that move such a tensor's integers unchanged (``qdq.PASS_THROUGH``)."""
    for node in graph.nodes:
        kernel = kernel_of(node)
        if kernel in QUANT_ROLES:
            params = node_quant(kernel, node.inputs, node.attrs, graph)
            for role, (data, _s, _z, _a) in role_slots(kernel, len(node.inputs)).items():
                tensor = node.outputs[0] if data is None else node.inputs[data]
                info = graph.tensors.get(tensor)
                if role in params and info is not None and np.dtype(info.dtype) == params[role].dtype:
                    info.quant = params[role]
        elif kernel in PASS_THROUGH and node.inputs and node.outputs:
            src, dst = graph.tensors.get(node.inputs[0]), graph.tensors.get(node.outputs[0])
            if src is not None and dst is not None and src.quant is not None and src.dtype == dst.dtype:
                dst.quant = src.quant


def quantize_graph(graph: Graph) -> int:
    """The whole pass (module doc): fold, zero points, annotations.  Returns how many chains folded."""
    folded = fold_chains(graph)
    normalize_zero_points(graph)
    annotate_tensors(graph)
    return folded

