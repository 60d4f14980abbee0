"""The Relu after a dynamic MatMul folded into its ``dynamic_quantize_matmul`` (``examplejson/qdq_fold.py``,
the float store's Relu in ``qgemm.c`` / ``qgemm_x86.c``), on models ``quantize_dynamic`` writes: a feed-forward
block (MatMul + bias -> Relu -> MatMul), the Relu directly after the product or behind a Reshape (as a
transformer's feed-forward holds it).  The fold happens (no Relu step is left), and the output is onnxruntime's
within 1e-3 of its range on >= 99% of the elements, and the unfused graph's (the numpy reference kernels on the
nodes as written: compiled kernels off) to 1e-5; the inputs reach both ends of the quantized range.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import need_module, need_program

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

onnx = need_module("onnx", "builds the models")
ort = need_module("onnxruntime", "quantizes the models and is the reference")
import quant_models  # noqa: E402

from rpcsrv.client.compiler import compile_onnx  # noqa: E402


def _feed_forward(reshaped: bool):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    d, h = 32, 96
    inits = [numpy_helper.from_array((rng.standard_normal((d, h)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((h, d)) * 0.2).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([1, 16, h], np.int64), "s3"),
             numpy_helper.from_array(np.array([16, h], np.int64), "s2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"])]
    if reshaped:
        nodes += [helper.make_node("Reshape", ["a1", "s3"], ["r1"]), helper.make_node("Relu", ["r1"], ["u"]),
                  helper.make_node("Reshape", ["u", "s2"], ["r2"])]
    else:
        nodes += [helper.make_node("Relu", ["a1"], ["r2"])]
    nodes += [helper.make_node("MatMul", ["r2", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(lib: Path, x: np.ndarray):
    from rpcsrv.executor import load_module
    from rpcsrv.protocol.dtypes import Device

    ex = load_module(str(lib)).get_function("default")(Device(1, 0))
    ex.get_function("set_input")("x", x)
    ex.get_function("run")()
    steps = [s for fn in ex._functions.values() for s in getattr(fn, "_stepwise", ())]
    return ex.get_function("get_output")(0).copy(), steps


@pytest.mark.parametrize("reshaped", [False, True], ids=["relu", "reshape-relu"])
def test_relu_after_a_dynamic_matmul_is_folded(reshaped, tmp_path, monkeypatch):
    need_program("cc", "the int8 kernels are built with the board's C compiler")
    from rpcsrv.executor.kernels.clib import compiled

    model = quant_models.quantized(_feed_forward(reshaped), "dynamic")
    lib = tmp_path / "ffn.so"
    compile_onnx(model).export_library(str(lib))
    x = (np.random.default_rng(2).standard_normal((16, 32)) * 2).astype(np.float32)
    x[0, :4] = [40.0, -40.0, 0.0, 40.0]  # the range's ends (0 and 255 after DynamicQuantizeLinear)
    got, steps = _run(lib, x)
    fused = [s[0] for s in steps if s[0].op == "dynamic_quantize_matmul"]
    assert [n.attrs.get("activation") for n in fused] == ["relu", None], [s[0].op for s in steps]
    assert "relu" not in [s[0].op for s in steps]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert (np.abs(got - want) <= 1e-3 * np.abs(want).max()).mean() >= 0.99
    monkeypatch.setenv(compiled.ENV_SWITCH, "0")
    compiled.reset()
    try:
        plain, plain_steps = _run(lib, x)
    finally:
        monkeypatch.delenv(compiled.ENV_SWITCH)
        compiled.reset()
    # unfolded: the graph as written (the Relu a step of its own, or the compiler's Add+Relu)
    assert any(s[0].op == "relu" or s[0].attrs.get("activation") == "relu" for s in plain_steps)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5 * float(np.abs(plain).max()))


def test_the_dynamic_matmuls_of_one_input_quantize_it_once(tmp_path, monkeypatch):
    """A MiniLM-style encoder (``quantize_dynamic``): the Q, K and V products of each layer (reading one tensor, or
    Reshapes of it) share one holder; the output is the very one of the steps quantizing each for itself, and the
    holders are empty after the run."""
    need_program("cc", "the int8 kernels are built with the board's C compiler")
    from rpcsrv.executor.examplejson import subgraphs

    fm = quant_models.float_model("minilm", small=True)
    model = quant_models.quantized(fm, "dynamic")
    lib = tmp_path / "enc.so"
    compile_onnx(model).export_library(str(lib))
    feeds = quant_models.inputs_of(fm, seed=4)

    def run():
        from rpcsrv.executor import load_module
        from rpcsrv.protocol.dtypes import Device

        ex = load_module(str(lib)).get_function("default")(Device(1, 0))
        for key, value in feeds.items():
            ex.get_function("set_input")(key, value)
        ex.get_function("run")()
        steps = [s for fn in ex._functions.values() for s in getattr(fn, "_stepwise", ())]
        return ex.get_function("get_output")(0).copy(), steps

    got, steps = run()
    holders = [s[1].holder for s in steps if hasattr(s[1], "holder")]
    groups = {id(h): sum(h is g for g in holders) for h in holders}
    assert groups and set(groups.values()) == {3}, groups  # Q, K and V of every layer
    assert all(h[0] is None for h in holders)
    monkeypatch.setattr(subgraphs, "share_quantization", lambda steps: steps)
    alone, steps = run()
    assert not any(hasattr(s[1], "holder") for s in steps)
    np.testing.assert_array_equal(got, alone)
