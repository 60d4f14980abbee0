"""What the board would refuse is refused when compiling, with a message that fits the cause.

* attribute values the board does not implement (``Resize antialias=1``, ``BatchNormalization
  training_mode=1``) fail ``compile_onnx``, not ``run`` (the op catalogue says so);
* ops whose output size depends on the data (``NonZero``) get a message naming that cause;
* the advice for unsupported nodes fits: ``--ops`` only when ``--ops`` was given and left ops out.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rpcsrv.client.compiler import CompileError, UnsupportedNodesError, compile_onnx
from compiler_helpers import chain_model, make_model, reference, run_compiled


def _resize(antialias: int):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="shrink", mode="linear",
                            antialias=antialias)
    return make_model([node], [("x", [1, 1, 4, 4])], [("y", [1, 1, 2, 2])],
                      {"scales": np.array([1, 1, 0.5, 0.5], np.float32)}, opset=18)


def _batchnorm(training_mode: int):
    c = 3
    inits = {"s": np.ones(c, np.float32), "b": np.zeros(c, np.float32), "m": np.zeros(c, np.float32),
             "v": np.ones(c, np.float32)}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn",
                            training_mode=training_mode)
    return make_model([node], [("x", [2, c, 4, 4])], [("y", [2, c, 4, 4])], inits, opset=15)


@pytest.mark.parametrize("build, attr", [(_batchnorm, "training_mode=1"), (_resize, "antialias=1")])
def test_refused_attribute_values_fail_at_compile_time(build, attr):
    model = build(1)
    with pytest.raises(UnsupportedNodesError) as info:
        compile_onnx(model)
    text = str(info.value)
    assert f"{attr} is not supported" in text and "the board takes 0" in text
    assert "--ops" not in text and "change the attribute values" in text


def test_the_accepted_values_still_compile_and_match_onnxruntime(tmp_path):
    model = _resize(0)
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)
    got = run_compiled(compile_onnx(model), {"x": x}, tmp_path)
    np.testing.assert_allclose(got[0], reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    bn = _batchnorm(0)
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(run_compiled(compile_onnx(bn), {"x": x}, tmp_path, "bn.blob")[0],
                               reference(bn, {"x": x})[0], rtol=1e-5, atol=1e-6)


def _nonzero_model(constant: bool):
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="where_nonzero"),
             helper.make_node("Transpose", ["nz"], ["y"], name="t")]
    inits = {"x": np.array([[0, 1.5, 0], [2, 0, 3]], np.float32)} if constant else {}
    graph = helper.make_graph(nodes, "nz", [] if constant else [helper.make_tensor_value_info("x", 1, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_data_dependent_ops_name_the_real_cause():
    with pytest.raises(CompileError) as info:
        compile_onnx(_nonzero_model(constant=False))
    text = str(info.value)
    assert "node 'where_nonzero' (NonZero: how many elements are non-zero)" in text
    assert "depends on the input values" in text and "no --input-shape can make it static" in text
    assert "Give concrete --input-shape" not in text


def test_a_data_dependent_op_on_a_constant_is_folded(tmp_path):
    compiled = compile_onnx(_nonzero_model(constant=True))
    assert compiled.params  # the whole result is known when compiling
    assert [p.tolist() for p in compiled.params.values()] == [[[0, 1], [1, 0], [1, 2]]]


def test_plain_missing_shapes_still_ask_for_shapes():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, ["n", 3])],
                              [helper.make_tensor_value_info("y", 1, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="--input-shape"):
        compile_onnx(model)


def test_advice_without_ops_does_not_mention_ops():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("Det", ["a"], ["d"], name="det")]
    model = make_model(nodes, [("x", [3, 3])], [("d", [])])
    with pytest.raises(UnsupportedNodesError) as info:
        compile_onnx(model)
    text = str(info.value)
    assert "no kernel 'det' on the board" in text and "the board has no kernel for Det" in text
    assert "--ops" not in text


def test_advice_with_ops_names_the_ops_to_add():
    with pytest.raises(UnsupportedNodesError) as info:
        compile_onnx(chain_model(), ops="add,mul", host_fallback=False)
    text = str(info.value)
    assert "add relu, sigmoid to --ops" in text and "has no kernel" not in text
