"""Conv → BatchNormalization folding (rpcsrv.client.compiler.simplify): folded where it is safe, results
still match onnxruntime, BatchNormalization kept everywhere else."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client import compile_onnx
from rpcsrv.client.compiler.onnx_import import import_onnx
from rpcsrv.client.compiler.simplify import fold_conv_batchnorm
from rpcsrv.client.demo_models import sample_inputs
from compiler_helpers import make_model, reference, run_compiled
from conftest import need_module

RNG = np.random.default_rng(7)


def bn_params(prefix: str, c: int) -> dict:
    """Non-trivial inference statistics (positive variances, scales around 1)."""
    return {f"{prefix}_s": (1 + 0.3 * RNG.standard_normal(c)).astype("float32"),
            f"{prefix}_b": (0.2 * RNG.standard_normal(c)).astype("float32"),
            f"{prefix}_m": (0.5 * RNG.standard_normal(c)).astype("float32"),
            f"{prefix}_v": (0.5 + RNG.random(c)).astype("float32")}


def bn(x: str, out: str, prefix: str, **attrs):
    return helper.make_node("BatchNormalization", [x] + [f"{prefix}_{k}" for k in "sbmv"], [out],
                            name=f"{prefix}_bn", **attrs)


def weights(*shape):
    return (0.3 * RNG.standard_normal(shape)).astype("float32")


def ops_of(compiled) -> list[str]:
    return [op for sg in compiled.subgraphs for op in sg.ops]


def check_against_ort(model, tmp_path, **compile_args):
    need_module("onnxruntime")
    compiled = compile_onnx(model, **compile_args)
    feed = sample_inputs(model, 3)
    for got, want in zip(run_compiled(compiled, feed, tmp_path), reference(model, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return compiled


def conv_bn_relu_model(bias: bool = True, group: int = 1, epsilon: float = 1e-5):
    c_in, c_out = 4, 8
    inits = {"w": weights(c_out, c_in // group, 3, 3), **bn_params("n1", c_out)}
    conv_in = ["x", "w"]
    if bias:
        inits["cb"] = weights(c_out)
        conv_in.append("cb")
    nodes = [helper.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], group=group, name="conv"),
             bn("c", "n", "n1", epsilon=epsilon),
             helper.make_node("Relu", ["n"], ["out"], name="relu")]
    return make_model(nodes, [("x", [1, c_in, 9, 9])], [("out", [1, c_out, 9, 9])], inits)


@pytest.mark.parametrize("bias, group, epsilon", [(True, 1, 1e-5), (False, 1, 1e-3), (True, 2, 1e-5),
                                                  (False, 4, 1e-5)])
def test_conv_bn_relu_folds_into_one_fused_conv(bias, group, epsilon, tmp_path):
    model = conv_bn_relu_model(bias, group, epsilon)
    compiled = check_against_ort(model, tmp_path)
    (sg,) = compiled.subgraphs
    assert sg.ops == ["conv"] and sg.patterns == ["examplejson.conv2d_bias_relu"]
    assert "batch_normalization" not in sg.code and '"activation": "relu"' in sg.code
    shapes = sorted(a.shape for a in sg.constants.values())
    assert shapes == [(8,), (8, 4 // group, 3, 3)]
    assert all(a.dtype == np.float32 for a in sg.constants.values())


def test_folded_values_are_the_affine_map():
    graph = import_onnx(conv_bn_relu_model())
    w, cb = graph.constants["w"], graph.constants["cb"]
    s, b, m, v = (graph.constants[f"n1_{k}"].astype(np.float64) for k in "sbmv")
    assert fold_conv_batchnorm(graph) == 1
    (conv, relu) = graph.nodes
    assert conv.op_type == "Conv" and conv.outputs == ["n"] and relu.inputs == ["n"]
    scale = s / np.sqrt(v + 1e-5)
    np.testing.assert_allclose(graph.constants[conv.inputs[1]], w * scale[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(graph.constants[conv.inputs[2]], (cb - m) * scale + b, rtol=1e-6, atol=1e-7)
    assert graph.constants["w"] is w  # the original constants are untouched


def test_bn_after_a_non_conv_is_kept(tmp_path):
    inits = {"w": weights(4, 4, 3, 3), **bn_params("n1", 4), **bn_params("n2", 4)}
    nodes = [bn("x", "a", "n1"),  # straight on the model input
             helper.make_node("Conv", ["a", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             bn("r", "out", "n2")]  # after a relu
    model = make_model(nodes, [("x", [1, 4, 6, 6])], [("out", [1, 4, 6, 6])], inits)
    compiled = check_against_ort(model, tmp_path)
    assert ops_of(compiled).count("batch_normalization") == 2


def test_conv_output_used_elsewhere_keeps_bn(tmp_path):
    inits = {"w": weights(4, 4, 3, 3), **bn_params("n1", 4)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             bn("c", "n", "n1"),
             helper.make_node("Add", ["c", "n"], ["out"], name="add")]
    model = make_model(nodes, [("x", [1, 4, 6, 6])], [("out", [1, 4, 6, 6])], inits)
    compiled = check_against_ort(model, tmp_path)
    assert ops_of(compiled) == ["conv", "batch_normalization", "add"]


def test_conv_output_that_is_a_model_output_keeps_bn(tmp_path):
    inits = {"w": weights(4, 4, 1, 1), **bn_params("n1", 4)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), bn("c", "out", "n1")]
    model = make_model(nodes, [("x", [1, 4, 5, 5])], [("c", [1, 4, 5, 5]), ("out", [1, 4, 5, 5])], inits)
    compiled = check_against_ort(model, tmp_path)
    assert "batch_normalization" in ops_of(compiled)


def test_non_constant_weights_or_statistics_keep_bn():
    inits = {"w": weights(4, 4, 1, 1), **bn_params("n1", 4)}
    var = inits.pop("n1_v")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), bn("c", "out", "n1")]
    model = make_model(nodes, [("x", [1, 4, 5, 5]), ("n1_v", [4])], [("out", [1, 4, 5, 5])], inits)
    assert "batch_normalization" in ops_of(compile_onnx(model))
    assert "batch_normalization" not in ops_of(compile_onnx(model, bind_inputs={"n1_v": var}))
    inits = {**bn_params("n1", 4)}
    model = make_model(nodes, [("x", [1, 4, 5, 5]), ("w", [4, 4, 1, 1])], [("out", [1, 4, 5, 5])], inits)
    assert "batch_normalization" in ops_of(compile_onnx(model))


def test_shared_weights_keep_their_values_for_the_other_conv(tmp_path):
    inits = {"w": weights(4, 4, 3, 3), **bn_params("n1", 4)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             bn("c1", "n", "n1"),
             helper.make_node("Conv", ["n", "w"], ["out"], pads=[1, 1, 1, 1], name="conv2")]
    model = make_model(nodes, [("x", [1, 4, 6, 6])], [("out", [1, 4, 6, 6])], inits)
    compiled = check_against_ort(model, tmp_path)
    assert ops_of(compiled) == ["conv", "conv"]


def test_training_mode_and_opt_out_keep_bn():
    graph = import_onnx(conv_bn_relu_model())
    graph.nodes[1].attrs["training_mode"] = 1
    assert fold_conv_batchnorm(graph) == 0
    assert [n.op_type for n in graph.nodes] == ["Conv", "BatchNormalization", "Relu"]
    compiled = compile_onnx(conv_bn_relu_model(), fold_batchnorm=False)
    # (the kept BatchNormalization takes the Relu after it as its fused activation)
    assert ops_of(compiled) == ["conv", "batch_normalization"]
    assert compiled.subgraphs[0].patterns == ["examplejson.batch_norm_relu"]


def test_bench_style_resnet_block_folds_every_bn(tmp_path):
    """Conv-BN-Relu, Conv-BN, 1x1 projection Conv-BN, Add, Relu: no batch_normalization is left."""
    inits = {"w1": weights(8, 4, 3, 3), "w2": weights(8, 8, 3, 3), "wp": weights(8, 4, 1, 1),
             **bn_params("n1", 8), **bn_params("n2", 8), **bn_params("np", 8)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], name="c1"),
             bn("c1", "b1", "n1"), helper.make_node("Relu", ["b1"], ["r1"], name="r1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="c2"),
             bn("c2", "b2", "n2"),
             helper.make_node("Conv", ["x", "wp"], ["cp"], strides=[2, 2], name="cp"),
             bn("cp", "bp", "np"),
             helper.make_node("Add", ["b2", "bp"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["out"], name="relu")]
    model = make_model(nodes, [("x", [1, 4, 10, 10])], [("out", [1, 8, 5, 5])], inits)
    compiled = check_against_ort(model, tmp_path)
    assert ops_of(compiled) == ["conv", "conv", "conv", "add"]  # (add_relu)
