"""The depthwise family's blocks (``bench/zoo_mobile.py``: MobileNetV2's inverted residuals with ReLU6 as
Clip, MobileNetV3's HardSwish and HardSigmoid squeeze-and-excitation, EfficientNet's SiLU and Sigmoid
squeeze-and-excitation), at small sizes: the compiler fuses Clip, HardSwish and x * Sigmoid(x) into the
convs, and the executor's results match onnxruntime with the compiled kernels (every conv as a run plan,
``kernels/plans.py``) and without them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rpcsrv.client.compiler import compile_onnx
from conftest import need_module, need_program

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import zoo_mobile  # noqa: E402

SMALL = {  # reduced depth and resolution: every kind of block, strides 1 and 2, 3x3 and 5x5
    "mobilenetv2": lambda: zoo_mobile.build_mobilenet_v2(side=64, stages=4),
    "mobilenetv3": lambda: zoo_mobile.build_mobilenet_v3(side=64, blocks=8),
    "efficientnet": lambda: zoo_mobile.build_efficientnet(side=64, stages=3),
}
FUSED = {"mobilenetv2": {"conv2d_bias_clip"}, "mobilenetv3": {"conv2d_bias_hard_swish", "conv2d_bias_relu"},
         "efficientnet": {"conv2d_bias_swish"}}


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    out = {}
    for name, build in SMALL.items():
        model = build()
        lib = tmp_path_factory.mktemp(name) / f"{name}.blob"
        compiled = compile_onnx(model)
        compiled.export_library(str(lib), fmt="blob")
        patterns = {p.split(".")[-1] for sg in compiled.subgraphs for p in sg.patterns}
        out[name] = (model, lib, patterns)
    return out


@pytest.mark.parametrize("name", list(SMALL))
def test_activations_fuse_into_convs(name, libraries):
    _, _, patterns = libraries[name]
    assert FUSED[name] <= patterns, patterns


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("kernels", ["compiled", "numpy"])
def test_mobile_blocks_match_onnxruntime(name, kernels, libraries, monkeypatch):
    ort = need_module("onnxruntime")
    from rpcsrv.executor import load_module
    from rpcsrv.executor.kernels.clib import compiled
    from rpcsrv.protocol.dtypes import Device

    if kernels == "compiled":
        monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
        need_program("cc", "the compiled depthwise kernel is built with the board's C compiler")
        assert compiled.status()["in_use"], compiled.status()
    else:
        monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    model, lib, _ = libraries[name]
    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"data": x})
    ex = load_module(str(lib)).get_function("default")(Device(1, 0))
    ex.get_function("set_input")("data", x)
    ex.get_function("run")()
    got = ex.get_function("get_output")(0)
    np.testing.assert_allclose(got, want[0], rtol=1e-4, atol=1e-4 * np.abs(want[0]).max())
    # every conv ran as a run plan (kernels/conv/plans_conv.py, plans_pointwise.py) with the compiled kernels,
    # none without them
    steps = [s for fn in ex._functions.values() for s in getattr(fn, "steps", ())]
    convs = [s for s in steps if s[0].op == "conv"]
    plans = {"rpcsrv.executor.kernels.conv.plans_conv", "rpcsrv.executor.kernels.conv.plans_pointwise"}
    planned = [s for s in convs if getattr(s[1], "__module__", "") in plans]
    assert len(planned) == len(convs) if kernels == "compiled" else not planned, (len(planned), len(convs))
