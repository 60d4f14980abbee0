"""The compiler makes QDQ chains and QOperator nodes first-class int8 ops: each carries its scales and zero points
(``Op.quant``, role -> QuantParams; ``TensorInfo.quant``) to the codegen that claims it, ``--ops conv`` claims the
int8 convolutions, the rest becomes host C; a fused Relu/Clip is the op's clamp; absent zero points are written."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

onnx = need_module("onnx", "builds the models")
need_module("onnxruntime", "quantizes the models")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from int8_models import quantized  # noqa: E402
from rpcsrv.client.compiler import compile_onnx, resolve_ops  # noqa: E402
from rpcsrv.client.compiler import codegens  # noqa: E402
from rpcsrv.client.compiler.examplejson import ExampleJSONCodegen  # noqa: E402
from rpcsrv.loader.opset import OPS  # noqa: E402

CASES = [("resnet", False, "QUInt8"), ("resnet", True, "QInt8"), ("mobilenet", False, "QInt8"),
         ("mobilenet", True, "QUInt8")]


class Probe(ExampleJSONCodegen):
    """ExampleJSON, recording every op it is given (what a plugin codegen's ``generate`` receives)."""

    name = "int8probe"

    def __init__(self):
        self.seen = []

    def generate(self, fn, graph):
        self.seen += [(op, graph) for op in fn.ops]
        return super().generate(fn, graph)


@pytest.fixture
def probe(monkeypatch):
    p = Probe()
    monkeypatch.setitem(codegens._LOADED, p.name, p)
    return p


def _qdq_convs(path) -> list[dict]:
    """Each float Conv of a QDQ model with the parameters its chain's DQ and Q nodes give (from the file)."""
    model = onnx.load(str(path))
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    made = {o: n for n in model.graph.node for o in n.output}
    readers = {i: n for n in model.graph.node for i in n.input}
    found = []
    for n in model.graph.node:
        if n.op_type != "Conv":
            continue
        x, w, q = made[n.input[0]], made[n.input[1]], readers[n.output[0]]
        found.append({"x": (consts[x.input[1]], consts[x.input[2]]), "w": (consts[w.input[1]], consts[w.input[2]]),
                      "y": (consts[q.input[1]], consts[q.input[2]]), "out": q.output[0]})
    return found


@pytest.mark.parametrize("name,per_channel,acts", CASES)
def test_qdq_convs_reach_the_codegen_with_their_parameters(tmp_path, probe, name, per_channel, acts):
    path = quantized(tmp_path, name, "QDQ", per_channel, acts)
    compiled = compile_onnx(str(path), ops="conv", codegen=probe.name)
    expected = {c["out"]: c for c in _qdq_convs(path)}
    convs = [(op, g) for op, g in probe.seen if op.kernel == "q_linear_conv"]
    assert [op.kernel for op, _ in probe.seen] == ["q_linear_conv"] * len(expected)  # --ops conv: the int8 ones
    assert {op.outputs[0] for op, _ in convs} == set(expected)
    for op, graph in convs:
        want = expected[op.outputs[0]]
        assert set(op.quant) == {"x", "w", "y"}
        for role in ("x", "w", "y"):
            scale, zp = want[role]
            np.testing.assert_array_equal(op.quant[role].scale, scale.reshape(op.quant[role].scale.shape))
            np.testing.assert_array_equal(op.quant[role].zero_point, np.broadcast_to(zp, op.quant[role].scale.shape))
            assert op.quant[role].dtype == zp.dtype
        assert op.quant["w"].per_channel == (per_channel and want["w"][0].size > 1)
        assert op.quant["w"].axis == (0 if op.quant["w"].per_channel else None)
        assert graph.tensors[op.outputs[0]].quant is op.quant["y"] or graph.tensors[op.outputs[0]].quant.same_as(
            op.quant["y"])
        assert graph.tensors[op.inputs[3]].dtype == "int8"  # the weights stay int8
    host = " ".join(compiled.host_functions)
    assert "quantize_linear" in host and "dequantize_linear" in host and "conv" not in host
    assert not any(n.op_type in ("Conv", "DequantizeLinear") and n.outputs[0] in expected for n in compiled.graph.nodes)


def test_ops_names_cover_the_int8_forms():
    assert {"conv", "q_linear_conv", "conv_integer"} <= resolve_ops("conv")
    assert resolve_ops("gemm,add") == {"gemm", "q_gemm", "add", "q_linear_add"}
    assert resolve_ops("relu") == {"relu"}
    assert "q_linear_conv" in OPS


def _model(nodes, inits, out_type=TensorProto.FLOAT, opset=17):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _conv_chain(act: str, zero_points: bool = True):
    """x -> Q -> DQ -> Conv (float bias) -> act -> Q -> DQ -> y, with or without the zero-point inputs."""
    inits = {"s": np.float32(0.05), "w": np.arange(-8, 8, dtype=np.int8).reshape(2, 2, 2, 2), "ws": np.float32(0.1),
             "wz": np.int8(0), "b": np.array([0.3, -0.2], np.float32), "ys": np.float32(0.04),
             "lo": np.float32(0.5), "hi": np.float32(2.0)}
    z = ["z"] if zero_points else []
    if zero_points:
        inits["z"] = np.uint8(128)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", *z], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", *z], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"]),
             helper.make_node("Conv", ["xf", "wf", "b"], ["c"], pads=[1, 1, 0, 0])]
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["a"]))
    elif act == "clip":
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["a"]))
    last = "a" if act else "c"
    nodes += [helper.make_node("QuantizeLinear", [last, "ys", *z], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "ys", *z], ["y"])]
    return _model(nodes, inits)


@pytest.mark.parametrize("act", ["relu", "clip", ""])
def test_a_relu_or_clip_is_the_int8_convs_clamp(act):
    compiled = compile_onnx(_conv_chain(act))
    (sg,) = compiled.subgraphs
    assert sg.ops == ["quantize_linear", "q_linear_conv", "dequantize_linear"]
    want = {"relu": '"activation": "relu"', "": "activation",
            "clip": '"activation": "clip", "activation_attrs": {"min": 0.5, "max": 2.0}'}[act]
    line = next(t for t in sg.code.splitlines() if t.strip().startswith("q_linear_conv"))
    assert (want in line) == bool(act)
    assert sg.patterns == [f"examplejson.qnn_conv2d{'_' + act if act else ''}"]


def test_absent_zero_points_are_written_as_the_zero_of_their_type(probe):
    compiled = compile_onnx(_conv_chain("relu", zero_points=False), codegen=probe.name)
    graph = compiled.graph
    by_kernel = {op.kernel: op for op, _ in probe.seen}
    assert set(by_kernel) == {"quantize_linear", "q_linear_conv", "dequantize_linear"}
    for kernel, slots in (("quantize_linear", [2]), ("q_linear_conv", [2, 5, 7]), ("dequantize_linear", [2])):
        op = by_kernel[kernel]
        for k in slots:
            zp = graph.constants[op.inputs[k]]
            assert zp.shape == () and zp.dtype == (np.int8 if k == 5 else np.uint8) and zp == 0
    assert by_kernel["q_linear_conv"].quant["y"].describe() == "uint8 scale 0.04 zero point 0"


def test_a_chain_with_computed_scales_stays_as_it_is():
    """A scale that is not constant: no fold (the chain's DQ and Q run as themselves)."""
    base = _conv_chain("")
    base.graph.input.append(helper.make_tensor_value_info("ys_in", TensorProto.FLOAT, []))
    for n in base.graph.node:
        n.input[:] = ["ys_in" if i == "ys" else i for i in n.input]
    compiled = compile_onnx(base)
    assert compiled.subgraphs[0].ops[:4] == ["quantize_linear", "dequantize_linear", "dequantize_linear", "conv"]


def test_weights_stay_int8_where_onnx_could_fold_their_dequantize(tmp_path):
    """At opset 21 onnx's reference evaluator runs DequantizeLinear: constant folding would turn every quantized
    weight into a float constant before the QDQ fold saw it; DequantizeLinear is never folded."""
    from onnx import version_converter

    model = version_converter.convert_version(onnx.load(str(quantized(tmp_path, "mobilenet", "QDQ", True))), 21)
    compiled = compile_onnx(model, ops="conv")
    assert [k for sg in compiled.subgraphs for k in sg.ops] == ["q_linear_conv"] * 3
    assert not any(n.op_type == "Conv" for n in compiled.graph.nodes)
