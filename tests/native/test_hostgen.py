"""Each host op the compiler emits in C, run in process and compared with onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rpcsrv.client import compile_onnx
from conftest import need_module
from rpcsrv.native import load_native_module
from rpcsrv.protocol import Device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import reference  # noqa: E402


def _model(nodes, inputs, outputs, inits=None, opset=17):
    def info(name, shape, dtype):
        return helper.make_tensor_value_info(name, dtype, shape)
    graph = helper.make_graph(nodes, "h", [info(*i) for i in inputs], [info(*o) for o in outputs],
                              initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(model, feed, tmp_path):
    compiled = compile_onnx(model, ops="identity")  # an op set the models below do not use
    assert compiled.host_functions and not compiled.subgraphs
    path = compiled.export_library(tmp_path / "h.so")
    ex = load_native_module(str(path)).get_function("default")(Device(1, 0))
    for k, v in feed.items():
        ex.get_function("set_input")(k, v)
    ex.get_function("run")()
    return [ex.get_function("get_output")(i).copy() for i in range(len(model.graph.output))]


F, I32 = TensorProto.FLOAT, TensorProto.INT32
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Floor", "Ceil", "Erf", "Sin", "Cos", "Softplus",
         "HardSwish", ("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}), ("HardSigmoid", {"alpha": 0.3})]


@pytest.mark.parametrize("op", UNARY, ids=lambda o: o if isinstance(o, str) else o[0])
def test_unary(tmp_path, op):
    need_module("onnxruntime")
    kind, attrs = (op, {}) if isinstance(op, str) else op
    model = _model([helper.make_node(kind, ["x"], ["y"], **attrs)], [("x", [3, 7], F)], [("y", [3, 7], F)])
    x = np.random.default_rng(0).standard_normal((3, 7)).astype("float32") * 2
    np.testing.assert_allclose(_run(model, {"x": x}, tmp_path)[0], reference(model, {"x": x})[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("kind", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"])
@pytest.mark.parametrize("shapes", [([2, 3, 4], [2, 3, 4]), ([2, 3, 4], [4]), ([2, 1, 4], [3, 1]), ([1], [2, 3])])
def test_binary_broadcasting(tmp_path, kind, shapes):
    need_module("onnxruntime")
    if kind == "PRelu" and len(shapes[1]) > len(shapes[0]):
        pytest.skip("PRelu's slope broadcasts onto X only")
    out = list(np.broadcast_shapes(tuple(shapes[0]), tuple(shapes[1])))
    model = _model([helper.make_node(kind, ["a", "b"], ["y"])], [("a", shapes[0], F), ("b", shapes[1], F)],
                   [("y", out, F)])
    rng = np.random.default_rng(1)
    feed = {"a": np.abs(rng.standard_normal(shapes[0])).astype("float32") + 0.5,
            "b": rng.standard_normal(shapes[1]).astype("float32")}
    np.testing.assert_allclose(_run(model, feed, tmp_path)[0], reference(model, feed)[0], rtol=1e-5)


def test_int32_binary_and_copies(tmp_path):
    need_module("onnxruntime")
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]),
             helper.make_node("Transpose", ["m"], ["t"], perm=[1, 0]),
             helper.make_node("Concat", ["t", "t", "c"], ["y"], axis=1)]
    model = _model(nodes, [("a", [2, 3], I32), ("b", [3], I32), ("c", [3, 1], I32)], [("y", [3, 5], I32)])
    feed = {"a": np.arange(6, dtype="int32").reshape(2, 3) - 2, "b": np.array([3, -1, 7], "int32"),
            "c": np.array([[9], [8], [7]], "int32")}
    np.testing.assert_array_equal(_run(model, feed, tmp_path)[0], reference(model, feed)[0])


def test_softmax_pools_and_shapes(tmp_path):
    need_module("onnxruntime")
    shape = np.array([2, 48], "int64")
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              dilations=[1, 1]),
             helper.make_node("AveragePool", ["x"], ["q"], kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 0, 1],
                              count_include_pad=1),
             helper.make_node("AveragePool", ["x"], ["q2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalMaxPool", ["x"], ["g"]),
             helper.make_node("Softmax", ["p"], ["s"], axis=1),
             helper.make_node("LogSoftmax", ["q"], ["ls"], axis=-1),
             helper.make_node("Reshape", ["s", "shape"], ["r"]),
             helper.make_node("Flatten", ["g"], ["f"], axis=1),
             helper.make_node("Unsqueeze", ["f", "axes"], ["u"]),
             helper.make_node("Squeeze", ["u", "axes"], ["sq"]),
             helper.make_node("Clip", ["q2", "lo", "hi"], ["cl"])]
    model = _model(nodes, [("x", [2, 3, 8, 8], F)],
                   [("r", [2, 48], F), ("ls", [2, 3, 4, 8], F), ("sq", [2, 3], F), ("cl", [2, 3, 4, 4], F)],
                   {"shape": shape, "axes": np.array([2], "int64"), "lo": np.array(-0.2, "float32"),
                    "hi": np.array(0.3, "float32")})
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype("float32")
    for got, want in zip(_run(model, {"x": x}, tmp_path), reference(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_host_function_checks_its_arguments(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", [4], F)], [("y", [4], F)])
    compiled = compile_onnx(model, ops="identity")
    (symbol,) = compiled.host_functions
    fn = load_native_module(str(compiled.export_library(tmp_path / "r.so"))).find_function(symbol)
    with pytest.raises(RuntimeError, match=f"{symbol}: argument 0 must be float32 with 4 elements"):
        fn(np.zeros(5, np.float32), np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match="expected 2 arguments"):
        fn(np.zeros(4, np.float32))
