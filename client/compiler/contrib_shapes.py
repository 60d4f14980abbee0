"""Shape and dtype inference for onnxruntime's ``com.microsoft`` quantized ops, which ``onnx``'s own
``infer_shapes`` does not know (it leaves their outputs, and everything after them, without a shape).

onnxruntime's quantizer writes these ops in its QOperator format (``QLinearAdd``, ``QLinearMul``,
``QLinearConcat``, ``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QLinearSigmoid``,
``QLinearLeakyRelu``, ``QLinearSoftmax``, ``QGemm``) and its dynamic format (``DynamicQuantizeMatMul``,
``MatMulIntegerToFloat``).  Each one's output has the shape of a standard ONNX op on the same operands
(:data:`SURROGATES`: ``QLinearAdd`` is ``Add`` of its two data inputs, ``QLinearAveragePool`` is
``AveragePool`` with its window attributes, ...), so that op's own ONNX inference rule gives it: no pool
or broadcast arithmetic is written a second time here.  The element type is the output zero point's
(``QGemm`` without ``y_scale``, and the MatMul ops: float32).

:func:`infer_shapes` alternates onnx's inference and this one until no tensor is left to learn (a contrib
op's output feeds standard ops, whose shapes onnx then infers, which feed the next contrib op).
"""

from __future__ import annotations

from typing import Callable, Optional

import onnx
from onnx import TensorProto, helper

MS_DOMAIN = "com.microsoft"
#: contrib op -> (standard op, positions of its operands among the contrib op's inputs or "concat",
#: attributes not to pass on, output type: "zero_point" (input index) or a TensorProto type)
SURROGATES = {
    "QLinearAdd": ("Add", (0, 3), (), ("zero_point", 7, 0)),
    "QLinearMul": ("Mul", (0, 3), (), ("zero_point", 7, 0)),
    "QLinearConcat": ("Concat", "concat", (), ("zero_point", 1, None)),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", (0,), ("channels_last",), ("zero_point", 4, 0)),
    "QLinearAveragePool": ("AveragePool", (0,), ("channels_last",), ("zero_point", 4, 0)),
    "QLinearSigmoid": ("Identity", (0,), (), ("zero_point", 4, 0)),
    "QLinearLeakyRelu": ("Identity", (0,), ("alpha",), ("zero_point", 4, 0)),
    "QLinearSoftmax": ("Identity", (0,), ("axis", "opset"), ("zero_point", 4, 0)),
    "QGemm": ("Gemm", (0, 3), ("alpha",), ("zero_point", 8, TensorProto.FLOAT)),
    "DynamicQuantizeMatMul": ("MatMul", (0, 1), (), TensorProto.FLOAT),
    "MatMulIntegerToFloat": ("MatMul", (0, 1), (), TensorProto.FLOAT),
}
MAX_ROUNDS = 64


def _known(model: onnx.ModelProto) -> dict[str, tuple[int, tuple]]:
    """Tensor name -> (element type, static shape) of every tensor whose type and shape are known."""
    out = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and tt.elem_type and \
                all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = (tt.elem_type, tuple(d.dim_value for d in tt.shape.dim))
    for t in model.graph.initializer:
        out[t.name] = (t.data_type, tuple(t.dims))
    return out


def _output_type(node: onnx.NodeProto, rule, known: dict) -> Optional[int]:
    if not isinstance(rule, tuple):
        return rule
    _, index, default = rule
    if index < len(node.input) and node.input[index] and node.input[index] in known:
        return known[node.input[index]][0]
    if default == 0:  # a zero point left out: the data input's type (onnxruntime's rule)
        return known[node.input[0]][0] if node.input and node.input[0] in known else None
    if default is None and node.op_type == "QLinearConcat" and len(node.input) > 2 and node.input[2] in known:
        return known[node.input[2]][0]
    return default


def _surrogate_shape(node: onnx.NodeProto, known: dict, opset: int) -> Optional[tuple]:
    """The output shape of ``node`` by its surrogate's ONNX inference, or None while an operand is unknown."""
    op, operands, drop, _ = SURROGATES[node.op_type]
    names = list(node.input[2::3]) if operands == "concat" else [node.input[k] if k < len(node.input) else ""
                                                                 for k in operands]
    if not names or any(not n or n not in known for n in names):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}
    if any(a.name == "channels_last" and a.i for a in node.attribute):
        return None  # channels-last pools: not written by the quantizer for ONNX models, left unknown
    inputs = [helper.make_tensor_value_info(f"i{k}", TensorProto.FLOAT, known[n][1]) for k, n in enumerate(names)]
    probe = helper.make_node(op, [f"i{k}" for k in range(len(names))], ["o"], **attrs)
    graph = helper.make_graph([probe], "probe", inputs, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(opset, 13))])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # the surrogate refuses these operands: the op's output stays unknown, reported later
        return None
    tt = inferred.graph.output[0].type.tensor_type
    if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
        return None
    return tuple(d.dim_value for d in tt.shape.dim)


def contrib_value_infos(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Value infos of the ``com.microsoft`` quantized ops' outputs that onnx left without a static shape and
    that can be inferred now."""
    known = _known(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    found = []
    for node in model.graph.node:
        if node.domain != MS_DOMAIN or node.op_type not in SURROGATES or not node.output or \
                not node.output[0] or node.output[0] in known:
            continue
        shape = _surrogate_shape(node, known, opset)
        elem = _output_type(node, SURROGATES[node.op_type][3], known)
        if shape is None or not elem:
            continue
        found.append(helper.make_tensor_value_info(node.output[0], elem, shape))
        known[node.output[0]] = (elem, shape)
    return found


def infer_shapes(model: onnx.ModelProto, onnx_infer: Callable[[onnx.ModelProto], onnx.ModelProto]) -> onnx.ModelProto:
    """``onnx_infer(model)`` (onnx's inference), completed with the contrib ops' outputs, alternately until
    no new tensor is learnt."""
    model = onnx_infer(model)
    for _ in range(MAX_ROUNDS):
        new = contrib_value_infos(model)
        if not new:
            break
        outputs = {vi.name for vi in model.graph.output}
        for vi in new:
            target = next((o for o in model.graph.output if o.name == vi.name), None) if vi.name in outputs else None
            if target is not None:
                target.CopyFrom(vi)
            else:
                model.graph.value_info.append(vi)
        model = onnx_infer(model)
    return model
