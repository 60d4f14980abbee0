"""Small ONNX models and a run helper for the compiler tests (built with onnx.helper, no downloads)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rpcsrv.executor import load_module
from rpcsrv.protocol.dtypes import Device

F = TensorProto.FLOAT


def run_in_process(path: str, inputs: dict, num_outputs: int) -> list:
    """A conformance runner without RPC: load ``path`` with ``rpcsrv.executor`` (what the board's
    ``load_module`` does), run factory "default" on CPU, return the outputs."""
    gmod = load_module(path).get_function("default")(Device(1, 0))
    for name, value in inputs.items():
        gmod.get_function("set_input")(name, value)
    gmod.get_function("run")()
    return [np.array(gmod.get_function("get_output")(i)) for i in range(num_outputs)]


def make_model(nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "m") -> onnx.ModelProto:
    """A checked model; ``inputs``/``outputs`` are (name, shape) pairs of float tensors."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def chain_model() -> onnx.ModelProto:
    """x, y (4x4) → add → relu → mul(y) → sigmoid → out: four ops in a line."""
    nodes = [helper.make_node("Add", ["x", "y"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "y"], ["m"], name="mul"),
             helper.make_node("Sigmoid", ["m"], ["out"], name="sigmoid")]
    return make_model(nodes, [("x", [4, 4]), ("y", [4, 4])], [("out", [4, 4])])


def dense_model(seed: int = 0) -> onnx.ModelProto:
    """x (2x8) → MatMul(W) → Add(b) → Relu → MatMul(W2) → Add(b2): two dense+bias layers."""
    rng = np.random.default_rng(seed)
    inits = {"W": rng.standard_normal((8, 6)).astype("float32"), "b": rng.standard_normal(6).astype("float32"),
             "W2": rng.standard_normal((6, 3)).astype("float32"),
             "b2": rng.standard_normal(3).astype("float32")}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["hr"], name="relu1"),
             helper.make_node("MatMul", ["hr", "W2"], ["o"], name="mm2"),
             helper.make_node("Add", ["o", "b2"], ["out"], name="bias2")]
    return make_model(nodes, [("x", [2, 8])], [("out", [2, 3])], inits)


def reference(model: onnx.ModelProto, inputs: dict) -> list[np.ndarray]:
    """onnxruntime's answer."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def run_compiled(compiled, inputs: dict, tmp_path, name: str = "m.blob", **export) -> list[np.ndarray]:
    """Export ``compiled`` into ``tmp_path`` and run it in-process."""
    path = compiled.export_library(os.path.join(tmp_path, name), **export)
    return run_in_process(path, inputs, len(compiled.output_names))


def parse_examplejson(code: str) -> list[tuple[str, list[str]]]:
    """(keyword, rest tokens) per non-empty line, header included."""
    return [(line.split()[0], line.split()[1:]) for line in code.splitlines() if line.strip()]
