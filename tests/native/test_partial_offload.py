"""Partial offload end to end: nodes outside ``--ops`` become C host functions in the .so, called by
func_name beside the ExampleJSON regions, run by rpcsrv through the real apache-tvm client, checked
against onnxruntime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from rpcsrv.client import UnsupportedNodesError, compile_onnx
from conftest import module_server, need_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import make_model, reference  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory)


def guide_model() -> onnx.ModelProto:
    """The BYOC guide's subgraph: four 10x10 inputs, add -> sub -> mul."""
    nodes = [helper.make_node("Add", ["input0", "input1"], ["a"], name="add"),
             helper.make_node("Sub", ["a", "input2"], ["s"], name="sub"),
             helper.make_node("Mul", ["s", "input3"], ["out"], name="mul")]
    return make_model(nodes, [(f"input{i}", [10, 10]) for i in range(4)], [("out", [10, 10])])


def cnn_model() -> onnx.ModelProto:
    """conv+relu -> maxpool / avgpool branches -> concat -> global avg pool -> flatten -> gemm ->
    softmax, plus a broadcast add of a constant and a transpose on the way."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype("float32") * 0.5,
             "b": rng.standard_normal(4).astype("float32"),
             "k": rng.standard_normal((1, 8, 1, 1)).astype("float32"),
             "fc": rng.standard_normal((8, 5)).astype("float32"),
             "fcb": rng.standard_normal(5).astype("float32")}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="maxpool"),
             helper.make_node("AveragePool", ["r"], ["p2"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1], name="avgpool"),
             helper.make_node("Concat", ["p1", "p2"], ["cat"], axis=1, name="concat"),
             helper.make_node("Add", ["cat", "k"], ["ck"], name="bias"),
             helper.make_node("Transpose", ["ck"], ["t"], perm=[0, 1, 3, 2], name="transpose"),
             helper.make_node("GlobalAveragePool", ["t"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["prob"], axis=-1, name="softmax")]
    return make_model(nodes, [("x", [2, 3, 8, 8])], [("prob", [2, 5])], inits)


def _run_on_board(server, path: Path, feed: dict, n_out: int) -> list[np.ndarray]:
    tvm = need_module("tvm", "the real TVM client")
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(path))
    lib = sess.load_module(path.name)
    dev = sess.cpu(0)
    ex = lib["default"](dev)
    for name, value in feed.items():
        ex["set_input"](name, tvm.runtime.tensor(value, dev))
    ex["run"]()
    return [ex["get_output"](i).numpy() for i in range(n_out)]


@pytest.mark.parametrize("ops,host", [("add", ["sub", "mul"]), ("sub,mul", ["add"])])
def test_guide_subgraph_with_part_of_the_ops(server, tmp_path, ops, host):
    need_module("onnxruntime")
    model = guide_model()
    compiled = compile_onnx(model, ops=ops)
    assert [s.split("_fused_")[1].rsplit("_", 1)[0] for s in compiled.host_functions] == host
    path = Path(compiled.export_library(tmp_path / "guide.so"))
    rng = np.random.default_rng(1)
    feed = {f"input{i}": rng.standard_normal((10, 10)).astype("float32") for i in range(4)}
    got = _run_on_board(server, path, feed, 1)
    np.testing.assert_allclose(got[0], reference(model, feed)[0], rtol=1e-6, atol=1e-6)
    out = subprocess.run([sys.executable, "-m", "rpcsrv", "inspect", str(path)], capture_output=True, text=True)
    for symbol in compiled.host_functions:
        assert f"{symbol}: host code" in out.stdout, out.stdout
    for sg in compiled.subgraphs:
        assert f"{sg.symbol}: ExampleJSON subgraph" in out.stdout, out.stdout


def test_cnn_with_pooling_concat_softmax_on_the_host(server, tmp_path):
    need_module("onnxruntime")
    model = cnn_model()
    compiled = compile_onnx(model, ops="conv,relu,gemm")
    kinds = {s.split("_fused_")[1].rsplit("_", 1)[0] for s in compiled.host_functions}
    assert {"max_pool", "average_pool", "concat", "softmax", "global_average_pool", "transpose", "add",
            "flatten"} <= kinds
    assert [sg.ops for sg in compiled.subgraphs] == [["conv"], ["gemm"]]
    path = Path(compiled.export_library(tmp_path / "cnn.so"))
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype("float32")
    got = _run_on_board(server, path, {"x": x}, 1)
    np.testing.assert_allclose(got[0], reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_node_without_host_code_is_named(tmp_path):
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("Det", ["a"], ["d"], name="det")]
    model = make_model(nodes, [("x", [3, 3])], [("d", [])])
    with pytest.raises(UnsupportedNodesError, match="'det' \\(Det\\).*Det has no host implementation"):
        compile_onnx(model, ops="add")


@pytest.mark.parametrize("create", ["tvm.graph_executor.create", "tvm.graph_executor_debug.create"])
def test_executor_created_over_a_library_in_the_worker(server, tmp_path, create):
    """``tvm.graph_executor.create(graph_json, lib, dev)`` over a library whose host code runs in the
    session's worker: the executor is built there too (its node calls stay in one process)."""
    need_module("onnxruntime")
    tvm = need_module("tvm", "the real TVM client")
    model = guide_model()
    compiled = compile_onnx(model, ops="add")
    path = Path(compiled.export_library(tmp_path / "guide.so"))
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(path))
    lib = sess.load_module(path.name)
    dev = sess.cpu(0)
    ex = sess.get_function(create)(compiled.graph_json, lib, 1, 0)
    rng = np.random.default_rng(6)
    feed = {f"input{i}": rng.standard_normal((10, 10)).astype("float32") for i in range(4)}
    for name, value in feed.items():
        ex["set_input"](name, tvm.runtime.tensor(value, dev))
    ex["run"]()
    np.testing.assert_allclose(ex["get_output"](0).numpy(), reference(model, feed)[0], rtol=1e-6, atol=1e-6)
    if "debug" in create:
        blob = bytes(ex["run_individual"](2, 1, 0))  # TVM's layout: a count, then float64 times
        assert len(blob) % 8 == 0 and np.frombuffer(blob, "<f8")[-3:].min() > 0  # the three op nodes ran
