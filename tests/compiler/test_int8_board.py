"""Quantized CNNs made by onnxruntime's quantizer, compiled by ``byoc compile`` and run on ``rpcsrv serve``:
``--ops conv`` puts the int8 convolutions into the codegen and the rest into host C; through the real apache-tvm
client the outputs are within one quantization step of onnxruntime's on at least 99% of the elements, and the
classes agree.  The host C of every int8 op is checked alone (nothing offloaded), and its rounding exactly:
ties to even, then saturation, per output channel."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

onnx = need_module("onnx", "builds the models")
need_module("onnxruntime", "quantizes the models and is the reference")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from int8_models import output_step, quantized, reference, sample_input, within_one_step  # noqa: E402
from rpcsrv.client.cli import main as byoc  # noqa: E402
from rpcsrv.client.run import run_library  # noqa: E402


def _library(tmp_path, name, fmt, per_channel, acts="QUInt8", ops="conv"):
    model = quantized(tmp_path, name, fmt, per_channel, acts)
    so = tmp_path / f"{model.stem}_{ops.replace(',', '_')}.so"
    assert byoc(["compile", str(model), "-o", str(so), "--ops", ops, "-q"]) == 0
    return model, so


def _check(model, ours, x):
    theirs = reference(model, x)
    assert within_one_step(ours, theirs, output_step(model)) >= 0.99
    assert ours.argmax() == theirs.argmax()


@pytest.mark.parametrize("name", ["resnet", "mobilenet"])
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_ops_conv_through_the_real_tvm_client(server, tmp_path, name, fmt, per_channel):
    tvm = need_module("tvm", "the real TVM client")
    from rpcsrv.client.compiler import compile_onnx

    model, so = _library(tmp_path, name, fmt, per_channel)
    compiled = compile_onnx(str(model), ops="conv")
    convs = sum(n.op_type == "QLinearConv" for n in compiled.graph.nodes)
    assert convs == {"resnet": 5, "mobilenet": 3}[name]
    assert [k for sg in compiled.subgraphs for k in sg.ops] == ["q_linear_conv"] * convs
    assert compiled.host_functions and not any("conv" in f for f in compiled.host_functions)
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(so))
    dev = sess.cpu(0)
    m = sess.load_module(so.name)["default"](dev)
    for seed in (11, 12):
        x = sample_input(seed)
        m["set_input"]("x", tvm.runtime.tensor(x, dev))
        m["run"]()
        _check(model, m["get_output"](0).numpy(), x)
    assert server.alive()


@pytest.mark.parametrize("name,fmt,per_channel,acts", [("resnet", "QDQ", False, "QUInt8"),
                                                       ("resnet", "QDQ", True, "QInt8"),
                                                       ("resnet", "QOperator", True, "QUInt8"),
                                                       ("mobilenet", "QOperator", False, "QInt8")])
def test_every_int8_op_in_host_c(server, tmp_path, capsys, name, fmt, per_channel, acts):
    """Nothing offloaded (the op set has no op of the model): every int8 op is a host C function, and each
    tensor is within one step of onnxruntime's (``byoc compare``)."""
    model, so = _library(tmp_path, name, fmt, per_channel, acts, ops="relu")
    x = sample_input(13)
    (out,), _ = run_library(str(so), server.host, server.port, inputs={"x": x}, progress=False)
    _check(model, out, x)
    np.save(tmp_path / "x.npy", x)
    code = byoc(["compare", str(so), str(model), "--host", server.host, "--port", str(server.port),
                 "--input", f"x={tmp_path / 'x.npy'}", "--ops", "relu"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "host output 0" in text and "compared tensors agree" in text


def _rounding_model(x_shape):
    """x -> QuantizeLinear (0.5, zero point 100) -> 1x1 QLinearConv, two output channels with per-channel weight
    scales (multipliers 0.5 and 0.25: ties on many accumulators), int32 bias, y zero point 10 -> Dequantize."""
    inits = {"xs": np.float32(0.5), "xz": np.uint8(100), "w": np.array([5, 10], np.int8).reshape(2, 1, 1, 1),
             "ws": np.array([1.0, 0.5], np.float32), "wz": np.zeros(2, np.int8), "ys": np.float32(1.0),
             "yz": np.uint8(10), "b": np.array([1, -2], np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_host_c_rounds_half_to_even_then_saturates(server, tmp_path):
    from rpcsrv.client.compiler import compile_onnx

    shape = [1, 1, 40, 30]
    x = (np.arange(-600, 600, dtype=np.float32) * 0.25).reshape(shape)  # every quarter: ties at each half step
    compiled = compile_onnx(_rounding_model(shape), ops="relu")
    assert [f.rsplit("_", 1)[0] for f in compiled.host_functions] == [
        "tvmgen_default_fused_quantize_linear", "tvmgen_default_fused_q_linear_conv",
        "tvmgen_default_fused_dequantize_linear"]
    path = compiled.export_library(str(tmp_path / "r.so"))
    (y,), _ = run_library(path, server.host, server.port, inputs={"x": x}, progress=False)
    xq = np.clip(np.rint(x / 0.5) + 100, 0, 255)  # numpy's rint: half to even
    acc = (xq - 100)[0, 0] * np.array([5, 10]).reshape(2, 1, 1) + np.array([1, -2]).reshape(2, 1, 1)
    yq = np.clip(np.rint(acc * np.array([0.5, 0.25]).reshape(2, 1, 1)) + 10, 0, 255)
    np.testing.assert_array_equal(y[0], yq - 10)
    assert (yq == 0).any() and (yq == 255).any()  # both ends saturate
    ties = ((acc * np.array([0.5, 0.25]).reshape(2, 1, 1)) % 1 == 0.5) & (yq > 0) & (yq < 255)
    assert ties.sum() > 200 and set(np.unique(yq[ties] % 2)) == {0.0}  # every tie went to the even neighbour
