"""Compile → export → run small models and compare with onnxruntime; partitioning as TVM does it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from rpcsrv.client import UnsupportedNodesError, compile_onnx
from rpcsrv.client.demo_models import sample_inputs, seed_model, small_cnn
from compiler_helpers import (
    chain_model, dense_model, make_model, parse_examplejson, reference, run_compiled,
)
from conftest import need_module


def _inputs(model, seed=1):
    return sample_inputs(model, seed)


@pytest.mark.parametrize("factory", [seed_model, small_cnn, dense_model, chain_model])
def test_models_match_onnxruntime(factory, tmp_path):
    need_module("onnxruntime")
    model = factory()
    feed = _inputs(model)
    got = run_compiled(compile_onnx(model), feed, tmp_path)
    want = reference(model, feed)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_seed_subgraph_is_the_guide_example():
    compiled = compile_onnx(seed_model(), ops="add,sub,mul")
    (sg,) = compiled.subgraphs
    lines = parse_examplejson(sg.code)
    assert lines[0] == ("tvmgen_default_examplejson_main_0", [])
    assert [k for k, _ in lines[1:]] == ["input"] * 4 + ["add", "sub", "mul", "output"]
    # each op reads the previous result: add(0,1) → sub(4,2) → mul(5,3)
    assert lines[5][1][:4] == ["4", "inputs:", "0", "1"]
    assert lines[6][1][:4] == ["5", "inputs:", "4", "2"]
    assert lines[7][1][:4] == ["6", "inputs:", "5", "3"]
    assert lines[8] == ("output", ["6"])


def test_composites_fuse_conv_bias_relu_and_dense_bias():
    cnn = compile_onnx(small_cnn())
    assert cnn.subgraphs[0].patterns.count("examplejson.conv2d_bias_relu") == 2
    assert "relu" not in cnn.subgraphs[0].ops  # folded into the convolutions
    assert '"activation": "relu"' in cnn.subgraphs[0].code
    dense = compile_onnx(dense_model())
    assert dense.subgraphs[0].ops == ["gemm", "gemm"]
    assert dense.subgraphs[0].patterns == ["examplejson.dense_bias_relu", "examplejson.dense_bias"]


def test_no_fusion_when_the_inner_tensor_is_used_elsewhere(tmp_path):
    need_module("onnxruntime")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["c", "r"], ["out"], name="add")]
    model = make_model(nodes, [("x", [1, 1, 4, 4])], [("out", [1, 1, 2, 2])],
                       {"w": np.ones((1, 1, 3, 3), "float32")})
    compiled = compile_onnx(model)
    assert compiled.subgraphs[0].ops == ["conv", "relu", "add"] and not compiled.subgraphs[0].patterns
    feed = _inputs(model)
    np.testing.assert_allclose(run_compiled(compiled, feed, tmp_path)[0], reference(model, feed)[0], rtol=1e-5)


def test_conv_then_add_bias_then_relu_fuses(tmp_path):
    need_module("onnxruntime")
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Add", ["c", "b"], ["cb"], name="bias"),
             helper.make_node("Relu", ["cb"], ["out"], name="relu")]
    model = make_model(nodes, [("x", [1, 2, 5, 5])], [("out", [1, 4, 5, 5])],
                       {"w": rng.standard_normal((4, 2, 3, 3)).astype("float32"),
                        "b": rng.standard_normal((4, 1, 1)).astype("float32")})
    compiled = compile_onnx(model)
    (sg,) = compiled.subgraphs
    assert sg.ops == ["conv"] and sg.patterns == ["examplejson.conv2d_bias_relu"]
    assert [a.shape for a in sg.constants.values()] == [(4, 2, 3, 3), (4,)]
    feed = _inputs(model)
    np.testing.assert_allclose(run_compiled(compiled, feed, tmp_path)[0], reference(model, feed)[0],
                               rtol=1e-5, atol=1e-6)
    # a bias that is not per channel stays a separate add
    model.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(np.ones((1, 5), "float32"), "b"))
    assert compile_onnx(model).subgraphs[0].ops == ["conv", "add"]  # (the Add takes the Relu: add_relu)


def test_partial_ops_give_several_subgraphs_and_the_error():
    with pytest.raises(UnsupportedNodesError) as info:
        compile_onnx(chain_model(), ops=["add", "mul"], host_fallback=False)
    err = info.value
    assert [n[:2] for n in err.nodes] == [("relu", "Relu"), ("sigmoid", "Sigmoid")]
    assert err.nodes[0][2] == [(4, 4)] and err.nodes[0][3] == [(4, 4)]
    assert [sg.ops for sg in err.partial.subgraphs] == [["add"], ["mul"]]
    text = str(err)
    assert "'relu' (Relu) inputs: a 4x4 float32 -> outputs: r 4x4 float32" in text
    assert "--ops" in text and "2 subgraph(s)" in text


def test_onnx_op_types_are_accepted_in_ops():
    compiled = compile_onnx(chain_model(), ops="Add,Relu,Mul,Sigmoid")
    assert [sg.ops for sg in compiled.subgraphs] == [["add", "mul", "sigmoid"]]
    assert compiled.subgraphs[0].patterns == ["examplejson.add_relu"]


def test_regions_do_not_merge_across_an_outside_node():
    # a = x+y; s = sigmoid(a) (unsupported); out = a*s. Merging add and mul would make a cycle.
    nodes = [helper.make_node("Add", ["x", "y"], ["a"], name="add"),
             helper.make_node("Sigmoid", ["a"], ["s"], name="sig"),
             helper.make_node("Mul", ["a", "s"], ["out"], name="mul")]
    model = make_model(nodes, [("x", [3]), ("y", [3])], [("out", [3])])
    with pytest.raises(UnsupportedNodesError) as info:
        compile_onnx(model, ops="add,mul", host_fallback=False)
    part = info.value.partial.subgraphs
    assert [sg.ops for sg in part] == [["add"], ["mul"]]
    assert part[0].outputs == ["a"] and part[1].inputs == ["a", "s"]


def test_independent_branches_and_multi_output_split(tmp_path):
    need_module("onnxruntime")
    nodes = [helper.make_node("Split", ["x"], ["p", "q"], axis=0, num_outputs=2, name="split"),
             helper.make_node("Relu", ["p"], ["o1"], name="relu"),
             helper.make_node("Neg", ["q"], ["o2"], name="neg")]
    model = make_model(nodes, [("x", [4, 2])], [("o1", [2, 2]), ("o2", [2, 2])], opset=18)
    compiled = compile_onnx(model)
    code = compiled.subgraphs[0].code
    assert '"output_index": 0' in code and '"output_index": 1' in code
    feed = _inputs(model)
    for g, w in zip(run_compiled(compiled, feed, tmp_path), reference(model, feed)):
        np.testing.assert_array_equal(g, w)


def test_shape_subgraph_is_folded_with_concrete_input_shape(tmp_path):
    need_module("onnxruntime")
    # out = reshape(x, [shape(x)[0], -1]) with a dynamic batch
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0, name="gather"),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0, name="concat"),
             helper.make_node("Reshape", ["x", "target"], ["out"], name="reshape")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2, 3])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["N", 6])],
        initializer=[helper.make_tensor("zero", onnx.TensorProto.INT64, [], [0]),
                     helper.make_tensor("axes", onnx.TensorProto.INT64, [1], [0]),
                     helper.make_tensor("minus1", onnx.TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = compile_onnx(model, input_shapes={"x": (5, 2, 3)})
    assert compiled.subgraphs[0].ops == ["reshape"]  # shape/gather/unsqueeze/concat folded
    feed = {"x": np.arange(30, dtype="float32").reshape(5, 2, 3)}
    np.testing.assert_array_equal(run_compiled(compiled, feed, tmp_path)[0], feed["x"].reshape(5, 6))
