"""Per-channel affine chains (rpcsrv.client.compiler.simplify.fold_affine) and constant folding at the model's
opset: BatchNormalization → Mul → Add → Relu becomes one fused batch_normalization, exactly where the
constants are per channel, the inner tensors are read once and none is a model output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rpcsrv.client import compile_onnx
from rpcsrv.client.compiler.onnx_import import import_onnx
from rpcsrv.client.compiler.simplify import fold_affine
from rpcsrv.client.demo_models import sample_inputs
from compiler_helpers import make_model, reference, run_compiled
from conftest import need_module

RNG = np.random.default_rng(11)
C = 6
SHAPE = [1, C, 5, 4]


def vec(*shape, base=0.0, dtype="float32"):
    return (base + 0.5 * RNG.standard_normal(shape)).astype(dtype)


def bn_inits(prefix: str, c: int = C, dtype="float32") -> dict:
    return {f"{prefix}_s": vec(c, base=1.0, dtype=dtype), f"{prefix}_b": vec(c, dtype=dtype),
            f"{prefix}_m": vec(c, dtype=dtype), f"{prefix}_v": (0.5 + RNG.random(c)).astype(dtype)}


def bn(x: str, out: str, prefix: str):
    return helper.make_node("BatchNormalization", [x] + [f"{prefix}_{k}" for k in "sbmv"], [out], name=f"{prefix}_bn")


def node(op, inputs, out, **attrs):
    return helper.make_node(op, inputs, [out], name=f"{op.lower()}_{out}", **attrs)


def compiled_ops(compiled) -> list[str]:
    return [op for sg in compiled.subgraphs for op in sg.ops]


def check(model, tmp_path, rtol=1e-5):
    """Compile, run on the board's executor, compare with onnxruntime; the compiled model."""
    need_module("onnxruntime")
    compiled = compile_onnx(model)
    feed = sample_inputs(model, 5)
    for got, want in zip(run_compiled(compiled, feed, tmp_path), reference(model, feed)):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)
    return compiled


def preactivation_model(mul_shape=(C, 1, 1), add_shape=(C, 1, 1), outputs=("out",)):
    """x → Concat(x, x2) → BN → Mul → Add → Relu → out (DenseNet's pre-activation, Caffe2 style)."""
    cc = 2 * C
    inits = {**bn_inits("n", cc), "m": vec(*[cc if d == C else d for d in mul_shape], base=1.0),
             "a": vec(*[cc if d == C else d for d in add_shape])}
    nodes = [node("Concat", ["x", "x2"], "cat", axis=1), bn("cat", "b", "n"), node("Mul", ["b", "m"], "mm"),
             node("Add", ["mm", "a"], "aa"), node("Relu", ["aa"], "out")]
    shape = [1, cc, 5, 4]
    return make_model(nodes, [("x", SHAPE), ("x2", SHAPE)], [(o, shape) for o in outputs], inits)


def test_bn_mul_add_relu_is_one_fused_batch_norm(tmp_path):
    compiled = check(preactivation_model(), tmp_path)
    (sg,) = compiled.subgraphs
    assert sg.ops == ["concat", "batch_normalization"]
    assert sg.patterns == ["examplejson.batch_norm_relu"]
    assert '"activation": "relu"' in sg.code and '"epsilon": 0.0' in sg.code


def test_folded_constants_compute_the_chain():
    graph = import_onnx(preactivation_model())
    assert fold_affine(graph) == 3
    (cat, bnode, relu) = graph.nodes
    assert bnode.op_type == "BatchNormalization" and bnode.outputs == ["aa"] and relu.inputs == ["aa"]
    s, b, m, v = (graph.constants[f"n_{k}"].astype(np.float64) for k in "sbmv")
    mul, add = (graph.constants[k].reshape(-1).astype(np.float64) for k in "ma")
    inv = s / np.sqrt(v + 1e-5)
    scale, shift, mean, var = (graph.constants[t] for t in bnode.inputs[1:])
    np.testing.assert_allclose(scale, inv * mul, rtol=1e-6)
    np.testing.assert_allclose(shift, (b - m * inv) * mul + add, rtol=1e-6, atol=1e-7)
    assert not mean.any() and (var == 1).all() and bnode.attrs == {"epsilon": 0.0}
    assert all(graph.constants[t].dtype == np.float32 for t in bnode.inputs[1:])
    assert "b" not in graph.tensors and "mm" not in graph.tensors  # the inner tensors are gone


def test_scalar_and_rank_one_constants_are_per_channel(tmp_path):
    # a scalar Mul and a (C, 1, 1) Add broadcast per channel too
    compiled = check(preactivation_model(mul_shape=(), add_shape=(1, C, 1, 1)), tmp_path)
    assert compiled_ops(compiled) == ["concat", "batch_normalization"]


@pytest.mark.parametrize("mul_shape", [(C, 5, 4), (1, 1, 1, 4), (5, 1)])
def test_constants_that_are_not_per_channel_are_kept(mul_shape, tmp_path):
    compiled = check(preactivation_model(mul_shape=mul_shape), tmp_path)
    assert compiled_ops(compiled) == ["concat", "batch_normalization", "mul", "add"]  # (add_relu)


def test_an_inner_tensor_that_is_a_model_output_is_kept(tmp_path):
    """``mm`` (after Mul) is a model output: BN and Mul fold (``mm`` is the fold's result), the Add stays."""
    compiled = check(preactivation_model(outputs=("out", "mm")), tmp_path)
    assert compiled_ops(compiled) == ["concat", "batch_normalization", "add"]


def test_an_inner_tensor_read_twice_is_kept(tmp_path):
    inits = {**bn_inits("n"), "m": vec(C, 1, 1), "a": vec(C, 1, 1)}
    nodes = [bn("x", "b", "n"), node("Mul", ["b", "m"], "mm"), node("Add", ["mm", "a"], "aa"),
             node("Sub", ["aa", "mm"], "out")]  # mm read by Add and by Sub
    model = make_model(nodes, [("x", SHAPE)], [("out", SHAPE)], inits)
    compiled = check(model, tmp_path)
    assert compiled_ops(compiled) == ["batch_normalization", "add", "sub"]


def test_mul_by_a_tensor_computed_at_run_time_is_kept(tmp_path):
    inits = {"a": vec(C, 1, 1)}
    nodes = [node("Mul", ["x", "y"], "mm"), node("Add", ["mm", "a"], "aa"), node("Relu", ["aa"], "out")]
    model = make_model(nodes, [("x", SHAPE), ("y", [C, 1, 1])], [("out", SHAPE)], inits)
    compiled = check(model, tmp_path)
    assert compiled_ops(compiled) == ["mul", "add"]


def test_conv_mul_add_relu_folds_into_the_conv(tmp_path):
    inits = {"w": vec(C, 3, 3, 3), "m": vec(C, 1, 1, base=1.0), "a": vec(C, 1, 1)}
    nodes = [node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1]), node("Mul", ["c", "m"], "mm"),
             node("Add", ["a", "mm"], "aa"), node("Relu", ["aa"], "out")]
    model = make_model(nodes, [("x", [1, 3, 5, 4])], [("out", SHAPE)], inits)
    compiled = check(model, tmp_path)
    (sg,) = compiled.subgraphs
    assert sg.ops == ["conv"] and sg.patterns == ["examplejson.conv2d_bias_relu"]


def test_a_lone_mul_without_a_fusion_to_gain_is_left_alone():
    inits = {"m": vec(C, 1, 1)}
    model = make_model([node("Mul", ["x", "m"], "mm"), node("Sigmoid", ["mm"], "out")],
                       [("x", SHAPE)], [("out", SHAPE)], inits)
    assert compiled_ops(compile_onnx(model)) == ["mul", "sigmoid"]


def test_float64_keeps_its_dtype(tmp_path):
    d = TensorProto.DOUBLE
    inits = {**bn_inits("n", dtype="float64"), "m": vec(C, 1, 1, dtype="float64"), "a": vec(C, 1, 1, dtype="float64")}
    nodes = [bn("x", "b", "n"), node("Mul", ["b", "m"], "mm"), node("Add", ["mm", "a"], "out")]
    graph = helper.make_graph(nodes, "f64", [helper.make_tensor_value_info("x", d, SHAPE)],
                              [helper.make_tensor_value_info("out", d, SHAPE)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    compiled = check(model, tmp_path, rtol=1e-12)
    (sg,) = compiled.subgraphs
    assert sg.ops == ["batch_normalization"]
    assert all(a.dtype == np.float64 for a in sg.constants.values())


def test_opset9_unsqueeze_of_constants_is_folded_at_the_models_opset(tmp_path):
    """The light zoo's DenseNet: Unsqueeze-1 (``axes`` attribute) of BN vectors.  The folder must
    evaluate it at opset 9 (the newest Unsqueeze takes ``axes`` as an input and refused it)."""
    inits = {**bn_inits("n"), "m": vec(C, base=1.0), "a": vec(C)}
    nodes = [bn("x", "b", "n"), node("Unsqueeze", ["m"], "mu", axes=[1, 2]), node("Mul", ["b", "mu"], "mm"),
             node("Unsqueeze", ["a"], "au", axes=[1, 2]), node("Add", ["mm", "au"], "aa"),
             node("Relu", ["aa"], "out")]
    model = make_model(nodes, [("x", SHAPE)], [("out", SHAPE)], inits, opset=9)
    graph = import_onnx(model)
    assert [n.op_type for n in graph.nodes] == ["BatchNormalization", "Mul", "Add", "Relu"]
    assert graph.constants["mu"].shape == (C, 1, 1)
    compiled = check(model, tmp_path)
    assert compiled_ops(compiled) == ["batch_normalization"]


def preact_conv_model(scale_sign=1.0, group=1, relu_also_output=False):
    """x → BN → Relu → Conv 3x3 (padded) → out: a pre-activation layer; the BN's scale is ``scale_sign``
    times positive values (one channel only when negative)."""
    inits = {**bn_inits("n"), "w": vec(4, C // group, 3, 3)}
    inits["n_s"] = np.abs(inits["n_s"]) + 0.1
    inits["n_s"][2] *= scale_sign
    nodes = [bn("x", "b", "n"), node("Relu", ["b"], "r"), node("Conv", ["r", "w"], "out", pads=[1, 1, 1, 1],
                                                             group=group)]
    outputs = [("out", [1, 4, 5, 4])] + ([("r", SHAPE)] if relu_also_output else [])
    return make_model(nodes, [("x", SHAPE)], outputs, inits)


def test_positive_scales_move_through_the_relu_into_the_conv(tmp_path):
    compiled = check(preact_conv_model(), tmp_path)
    (sg,) = compiled.subgraphs
    assert sg.ops == ["add", "conv"] and sg.patterns == ["examplejson.add_relu"]
    graph = import_onnx(preact_conv_model())
    from rpcsrv.client.compiler.simplify import simplify_inference

    w = graph.constants["w"]
    simplify_inference(graph)
    (add, relu, conv) = graph.nodes
    s, b, m, v = (graph.constants[f"n_{k}"].astype(np.float64) for k in "sbmv")
    inv = s / np.sqrt(v + 1e-5)
    np.testing.assert_allclose(graph.constants[add.inputs[1]].reshape(-1), (b - m * inv) / inv, rtol=1e-5)
    np.testing.assert_allclose(graph.constants[conv.inputs[1]], w * inv[None, :, None, None], rtol=1e-6)
    assert graph.constants["w"] is w  # the original weights keep their name and values


@pytest.mark.parametrize("model", [preact_conv_model(scale_sign=-1.0), preact_conv_model(group=2),
                                   preact_conv_model(relu_also_output=True)],
                         ids=["a negative scale", "grouped conv", "relu output is a model output"])
def test_scale_stays_when_it_cannot_move(model, tmp_path):
    compiled = check(model, tmp_path)
    assert compiled_ops(compiled) == ["batch_normalization", "conv"]


def test_an_op_set_without_batch_normalization_keeps_mul_and_add(tmp_path):
    """Composing needs the board's batch_normalization (it has no host implementation): with ``--ops``
    lacking it, the Mul and Add stay, offloaded as they are."""
    need_module("onnxruntime")
    inits = {"m": vec(C, 1, 1), "a": vec(C, 1, 1)}
    model = make_model([node("Mul", ["x", "m"], "mm"), node("Add", ["mm", "a"], "out")],
                       [("x", SHAPE)], [("out", SHAPE)], inits)
    assert compiled_ops(compile_onnx(model)) == ["batch_normalization"]
    compiled = compile_onnx(model, ops="mul,add", host_fallback=False)
    assert compiled_ops(compiled) == ["mul", "add"]
    feed = sample_inputs(model, 1)
    np.testing.assert_allclose(run_compiled(compiled, feed, tmp_path)[0], reference(model, feed)[0], rtol=1e-6)
    # and the scale moves through a Relu only where the board has the Add it leaves
    assert compiled_ops(compile_onnx(preact_conv_model(), ops="batch_normalization,relu,conv")) == \
        ["batch_normalization", "conv"]
