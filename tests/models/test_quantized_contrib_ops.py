"""onnxruntime's ``com.microsoft`` quantized ops through ``byoc compile``: their output shapes and dtypes inferred
(``client/compiler/contrib_shapes.py``: onnx's own inference leaves them unknown), each op offered to the board, and
the compiled library's output equal to onnxruntime's within one step.  Each op sits between two standard ops, so
that what follows it needs its inferred shape too."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

onnx = need_module("onnx", "builds the models")
ort = need_module("onnxruntime", "the reference")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from rpcsrv.client.compiler import compile_onnx  # noqa: E402
from rpcsrv.client.compiler.onnx_import import import_onnx  # noqa: E402

MS = "com.microsoft"
RNG = np.random.default_rng(5)
U8, S8, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT


def _c(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _params(prefix, scale, zp):
    return [_c(f"{prefix}s", np.float32(scale)), _c(f"{prefix}z", zp)]


#: op -> (inputs after the data input "q" (1, 8, 6, 6) uint8, or all of them where "q" is not first; constants,
#: attributes, output type)
CASES = {
    "QLinearAdd": (["qs", "qz", "b", "bs", "bz", "ys", "yz"],
                   [_c("b", RNG.integers(0, 256, (1, 8, 1, 6)).astype(np.uint8)), *_params("b", 0.03, np.uint8(7)),
                    *_params("y", 0.07, np.uint8(100))], {}, U8),
    "QLinearMul": (["qs", "qz", "b", "bs", "bz", "ys", "yz"],
                   [_c("b", RNG.integers(0, 256, (8, 1, 1)).astype(np.uint8)), *_params("b", 0.02, np.uint8(3)),
                    *_params("y", 0.5, np.uint8(9))], {}, U8),
    "QLinearConcat": (["ys", "yz", "q", "qs", "qz", "b", "bs", "bz"],
                      [*_params("y", 0.06, np.uint8(128)), _c("b", RNG.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)),
                       *_params("b", 0.04, np.uint8(120))], {"axis": 1}, U8),
    "QLinearGlobalAveragePool": (["qs", "qz", "ys", "yz"], _params("y", 0.01, np.uint8(128)), {}, U8),
    "QLinearAveragePool": (["qs", "qz", "ys", "yz"], _params("y", 0.05, np.uint8(128)),
                           {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, U8),
    "QLinearSigmoid": (["qs", "qz", "ys", "yz"], _params("y", 1 / 256, np.uint8(0)), {}, U8),
    "QLinearLeakyRelu": (["qs", "qz", "ys", "yz"], _params("y", 0.05, np.uint8(30)), {"alpha": 0.1}, U8),
    "QLinearSoftmax": (["qs", "qz", "ys", "yz"], _params("y", 1 / 256, np.uint8(0)), {"axis": -1, "opset": 13}, U8),
}


def _model(op, extra, consts, attrs, out_type, data_shape=(1, 8, 6, 6)):
    """Relu(float x) -> QuantizeLinear -> op -> DequantizeLinear (or the float output) -> Relu."""
    consts = [*_params("q", 0.04, np.uint8(128)), *consts]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("QuantizeLinear", ["r", "qs", "qz"], ["q"]),
             helper.make_node(op, ["q", *extra] if "q" not in extra else extra, ["o"], domain=MS, **attrs)]
    if out_type == F32:
        nodes.append(helper.make_node("Relu", ["o"], ["y"]))
    else:
        dq = ["o", "ys", "yz"] if any(c.name == "ys" for c in consts) else ["o", "qs", "qz"]
        nodes += [helper.make_node("DequantizeLinear", dq, ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", F32, data_shape)],
                              [helper.make_tensor_value_info("y", F32, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def _gemm_models():
    w = RNG.integers(-128, 128, (10, 24)).astype(np.int8)
    consts = [_c("w", w), *_params("w", 0.01, np.int8(0)), _c("c", RNG.integers(-500, 500, 10).astype(np.int32))]
    quantized = _model("QGemm", ["qs", "qz", "w", "ws", "wz", "c", "ys", "yz"],
                       consts + _params("y", 0.2, np.uint8(128)), {"transB": 1, "alpha": 1.0}, U8, (4, 24))
    floating = _model("QGemm", ["qs", "qz", "w", "ws", "wz", "c"], consts, {"transB": 1}, F32, (4, 24))
    b = RNG.integers(-128, 128, (24, 12)).astype(np.int8)
    dyn_consts = [_c("b", b), _c("bs", np.full(12, 0.02, np.float32)), _c("bz", np.zeros(12, np.int8)),
                  _c("bias", RNG.standard_normal(12).astype(np.float32))]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("DynamicQuantizeMatMul", ["r", "b", "bs", "bz", "bias"], ["o"], domain=MS),
             helper.make_node("Relu", ["o"], ["y"])]
    graph = helper.make_graph(nodes, "dqm", [helper.make_tensor_value_info("x", F32, (2, 5, 24))],
                              [helper.make_tensor_value_info("y", F32, None)], dyn_consts)
    dynamic = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return {"QGemm": quantized, "QGemm-float": floating, "DynamicQuantizeMatMul": dynamic}


def _all_models():
    models = {op: _model(op, *case) for op, case in CASES.items()}
    models.update(_gemm_models())
    return models


MODELS = _all_models()


@pytest.mark.parametrize("name", list(MODELS))
def test_contrib_op_shapes_are_inferred_and_the_library_matches_onnxruntime(name, tmp_path):
    from rpcsrv.executor import load_module
    from rpcsrv.protocol.dtypes import Device

    model = MODELS[name]
    x_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    graph = import_onnx(model)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    info = graph.tensors["o"]  # the contrib op's output, as the compiler inferred it
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    # (onnxruntime refuses an output declared with another element type than the op makes: the dtype is checked too)
    probe.graph.output.append(helper.make_tensor_value_info("o", helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)),
                                                            None))
    o = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run(["o"], {"x": x})[0]
    assert tuple(info.shape) == o.shape and np.dtype(info.dtype) == o.dtype, (info, o.shape, o.dtype)
    lib = tmp_path / f"{name}.so"
    compiled = compile_onnx(model)
    assert len(compiled.subgraphs) == 1  # the contrib op runs on the board with the rest
    compiled.export_library(str(lib))
    ex = load_module(str(lib)).get_function("default")(Device(1, 0))
    ex.get_function("set_input")("x", x)
    ex.get_function("run")()
    got = ex.get_function("get_output")(0)
    scale = next((numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "ys"), None)
    step = float(scale) if scale is not None and "float" not in name and "Dynamic" not in name else \
        1e-5 * max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= step * 1.001, (np.abs(got - want).max(), step)
