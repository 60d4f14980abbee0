"""``byoc compare`` and ``byoc profile`` on quantized libraries: int8 tensors are compared in quantization steps, and
a library whose int8 weights were changed names the first node that drifts by more than one step; the light
SqueezeNet of the ONNX zoo (whose old Softmax the compiler rewrites through tensors of its own) compares
without asking onnxruntime for those; onnxruntime's own errors are one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, need_module

onnx = need_module("onnx", "builds the models")
need_module("onnxruntime", "quantizes the models and is the reference")
from onnx import numpy_helper  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "compiler"))
from int8_models import quantized, sample_input  # noqa: E402

from rpcsrv.client.cli import main as byoc  # noqa: E402
from rpcsrv.client.compiler import compile_onnx  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A QDQ ResNet-like model, its library, and a library of the same model with conv3's weights changed."""
    d = tmp_path_factory.mktemp("int8")
    path = quantized(d, "resnet", "QDQ", True, "QUInt8")
    model = onnx.load(str(path))
    compile_onnx(model).export_library(str(d / "good.so"))
    weights = next(t for t in model.graph.initializer if t.name == "w3_quantized")
    bad = numpy_helper.to_array(weights).copy()
    bad[0] = -bad[0]  # one output channel's weights negated: that channel's values move by many steps
    weights.CopyFrom(numpy_helper.from_array(bad, weights.name))
    compile_onnx(model).export_library(str(d / "bad.so"))
    np.save(d / "x.npy", sample_input(31))
    return d, path


def _args(server, d):
    return ["--host", server.host, "--port", str(server.port), "--input", f"x={d / 'x.npy'}"]


def test_every_int8_kernel_agrees_within_a_step(server, models, capsys):
    d, path = models
    assert byoc(["compare", str(d / "good.so"), str(path), *_args(server, d), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    quantized_rows = [r for r in rows if r["max_steps"] == r["max_steps"]]
    kernels = [r["kernel"] for r in quantized_rows]
    assert kernels.count("q_linear_conv") == 5 and {"q_linear_add", "q_gemm", "max_pool"} <= set(kernels)
    assert all(r["ok"] and r["max_steps"] <= 1 for r in quantized_rows)
    assert all(abs(r["max_abs"] - r["max_steps"] * r["scale"]) < 1e-9 for r in quantized_rows)


def test_changed_weights_are_named_at_their_node_in_steps(server, models, capsys):
    d, path = models
    assert byoc(["compare", str(d / "bad.so"), str(path), *_args(server, d), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    first = result["first_difference"]
    assert (first["onnx_node"], first["onnx_op"], first["kernel"]) == ("conv3", "QLinearConv", "q_linear_conv")
    assert first["max_steps"] > 1 and first["max_abs"] == pytest.approx(first["max_steps"] * first["scale"])
    rows = result["rows"]
    k = rows.index(first)
    assert all(r["ok"] for r in rows[:k])  # everything before it agrees
    assert byoc(["compare", str(d / "bad.so"), str(path), *_args(server, d), "--steps", "1000"]) == 0
    capsys.readouterr()
    assert byoc(["compare", str(d / "bad.so"), str(path), *_args(server, d)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("first difference: ONNX node 'conv3' (QLinearConv") and " step(s) of " in last


def test_profile_of_a_quantized_library(server, models, capsys):
    d, _ = models
    assert byoc(["profile", str(d / "good.so"), *_args(server, d), "--repeat", "2", "--json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert node["ops"].count("q_linear_conv") == 5 and node["ops"][0] == "quantize_linear"
    assert node["inputs"] == [{"shape": [1, 3, 16, 16], "dtype": "float32"}]
    assert {k["dtype"] for k in node["kernels"]} >= {"uint8", "float32"}


def test_compare_on_the_light_squeezenet(server, tmp_path, capsys):
    """Its Softmax (opset 9, axis 1 of 4-D) becomes Flatten -> Softmax -> Reshape through tensors the model does not
    have: those are not asked of onnxruntime (which refused: 'Graph output (...) does not exist in the graph')."""
    model = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    if not model.exists():
        pytest.skip("this onnx wheel does not ship the light model zoo")
    compile_onnx(str(model)).export_library(str(tmp_path / "sq.so"))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    args = ["--host", server.host, "--port", str(server.port), "--input", f"data_0={tmp_path / 'x.npy'}"]
    assert byoc(["compare", str(tmp_path / "sq.so"), str(model), *args]) == 0
    out = capsys.readouterr()
    assert "compared tensors agree" in out.out and "Traceback" not in out.err
    assert "__flatten" in out.out  # the compiler's own nodes are listed, not compared


def test_an_onnxruntime_error_is_one_line(server, models, capsys, monkeypatch):
    import onnxruntime

    def refuse(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : something\nwent wrong\n  here")

    d, path = models
    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)
    assert byoc(["compare", str(d / "good.so"), str(path), *_args(server, d)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"byoc: error: onnxruntime cannot run {path}: ") and "\n" not in err
    assert "went wrong here" in err
