"""Nodes of old opsets keep their old meaning (``client/compiler/opsets.py``).

Each case is a one- or two-node model at an old opset whose meaning differs from the op's current
version; the compiled library (run by ``rpcsrv.executor``) must agree with onnxruntime, which
implements every version.  The ``onnx`` wheel's PyTorch-exported models (opset 6 and 9, with their
recorded outputs) are run as a whole too.
"""

from __future__ import annotations

import glob
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rpcsrv.client.compiler import compile_onnx
from rpcsrv.client.compiler.opsets import since_version
from rpcsrv.client.compiler.onnx_import import Node
from conftest import need_module

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "compiler"))
from compiler_helpers import run_in_process  # noqa: E402  (the executor in-process, shared with tests/compiler)

F = TensorProto.FLOAT
DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def model(nodes, inputs, outputs, opset, inits=()):
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 3 if opset < 8 else 4
    if m.ir_version == 3:  # IR 3: initializers are graph inputs too
        m.graph.input.extend(helper.make_tensor_value_info(k, F, np.shape(v)) for k, v in inits)
    return m


def run_both(m, feed, tmp_path):
    ort = need_module("onnxruntime")
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    path = str(tmp_path / "m.blob")
    compile_onnx(m).export_library(path)
    got = run_in_process(path, feed, len(want))
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


rng = np.random.default_rng(0)
X3 = rng.standard_normal((2, 3, 4)).astype(np.float32)
X4 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset,axis", [(9, None), (11, 0), (11, 1), (11, -2), (11, 2), (13, 1)])
def test_softmax_family_views_old_inputs_as_2d(op, opset, axis, tmp_path):
    attrs = {} if axis is None else {"axis": axis}
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", F, X3.shape)], [("y", F, X3.shape)], opset)
    got = run_both(m, {"x": X3}, tmp_path)
    if op == "Softmax" and opset < 13 and axis in (None, 1):
        np.testing.assert_allclose(got[0].reshape(2, -1).sum(axis=1), 1.0, rtol=1e-5)  # over 3x4 at once


def test_reshape_4_shape_attribute(tmp_path):
    m = model([helper.make_node("Reshape", ["x"], ["y"], shape=[4, -1])], [("x", F, X3.shape)],
              [("y", F, (4, 6))], 4)
    got = compile_and_run(m, {"x": X3}, tmp_path)
    np.testing.assert_array_equal(got[0], X3.reshape(4, 6))


def compile_and_run(m, feed, tmp_path, n=1):
    path = str(tmp_path / "m.blob")
    compile_onnx(m).export_library(path)
    return run_in_process(path, feed, n)


def test_concat_3_axis_defaults_to_1(tmp_path):
    m = model([helper.make_node("Concat", ["a", "b"], ["y"])], [("a", F, X3.shape), ("b", F, X3.shape)],
              [("y", F, (2, 6, 4))], 3)
    got = compile_and_run(m, {"a": X3, "b": X3 * 2}, tmp_path)
    np.testing.assert_array_equal(got[0], np.concatenate([X3, X3 * 2], axis=1))


def test_cast_5_takes_a_type_name(tmp_path):
    node = helper.make_node("Cast", ["x"], ["y"])
    node.attribute.append(helper.make_attribute("to", "INT32"))
    m = model([node], [("x", F, X3.shape)], [("y", TensorProto.INT32, X3.shape)], 5)
    got = compile_and_run(m, {"x": X3 * 10}, tmp_path)
    np.testing.assert_array_equal(got[0], (X3 * 10).astype(np.int32))


@pytest.mark.parametrize("opset", [6, 7])
def test_add_legacy_broadcast_aligns_at_axis(opset, tmp_path):
    b = rng.standard_normal(3).astype(np.float32)
    attrs = {"broadcast": 1, "axis": 1} if opset < 7 else {}
    shape = (3,) if opset < 7 else (3, 1, 1)
    m = model([helper.make_node("Add", ["x", "b"], ["y"], **attrs)], [("x", F, X4.shape)], [("y", F, X4.shape)],
              opset, inits=[("b", b.reshape(shape))])
    got = compile_and_run(m, {"x": X4}, tmp_path)
    np.testing.assert_allclose(got[0], X4 + b.reshape(3, 1, 1), rtol=1e-6)


def test_mul_legacy_broadcast_of_a_computed_tensor(tmp_path):
    attrs = {"broadcast": 1, "axis": 0}
    m = model([helper.make_node("Mul", ["x", "s"], ["y"], **attrs)], [("x", F, X4.shape), ("s", F, (2, 3))],
              [("y", F, X4.shape)], 6)
    s = rng.standard_normal((2, 3)).astype(np.float32)
    got = compile_and_run(m, {"x": X4, "s": s}, tmp_path)
    np.testing.assert_allclose(got[0], X4 * s.reshape(2, 3, 1, 1), rtol=1e-6)


def test_prelu_6_slope_per_channel(tmp_path):
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    m = model([helper.make_node("PRelu", ["x", "slope"], ["y"])], [("x", F, X4.shape)], [("y", F, X4.shape)], 6,
              inits=[("slope", slope)])
    got = compile_and_run(m, {"x": X4}, tmp_path)
    np.testing.assert_allclose(got[0], np.where(X4 < 0, X4 * slope.reshape(3, 1, 1), X4), rtol=1e-6)


def test_topk_1_k_attribute(tmp_path):
    m = model([helper.make_node("TopK", ["x"], ["v", "i"], k=2)], [("x", F, X3.shape)],
              [("v", F, (2, 3, 2)), ("i", TensorProto.INT64, (2, 3, 2))], 9)
    got = run_both(m, {"x": X3}, tmp_path)
    assert got[1].dtype == np.int64


def test_batchnorm_7_spatial_0_per_activation(tmp_path):
    c = [("s", rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)),
         ("b", rng.standard_normal((3, 4, 5)).astype(np.float32)),
         ("m", rng.standard_normal((3, 4, 5)).astype(np.float32)),
         ("v", rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32))]
    m = model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0, epsilon=1e-3)],
              [("x", F, X4.shape)], [("y", F, X4.shape)], 7, inits=c)
    got = compile_and_run(m, {"x": X4}, tmp_path)
    s, b, mean, var = (v for _, v in c)
    np.testing.assert_allclose(got[0], (X4 - mean) / np.sqrt(var + 1e-3) * s + b, rtol=1e-4, atol=1e-5)


def test_batchnorm_6_is_test_and_consumed_inputs_with_unread_statistics(tmp_path):
    c = [("s", np.ones(3, np.float32)), ("b", np.zeros(3, np.float32)),
         ("m", np.array([1, 2, 3], np.float32)), ("v", np.ones(3, np.float32))]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"],
                            is_test=1, epsilon=0.0, consumed_inputs=[0, 0, 0, 1, 1])
    m = model([node], [("x", F, X4.shape)], [("y", F, X4.shape)], 6, inits=c)
    got = compile_and_run(m, {"x": X4}, tmp_path)
    np.testing.assert_allclose(got[0], X4 - np.array([1, 2, 3], np.float32).reshape(3, 1, 1), rtol=1e-6)


@pytest.mark.parametrize("opset", [6, 7, 10, 12])
def test_dropout_mask_of_old_opsets_is_not_needed(opset, tmp_path):
    attrs = {"is_test": 1} if opset < 7 else {}
    m = model([helper.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.5, **attrs),
               helper.make_node("Relu", ["y"], ["z"])], [("x", F, X3.shape)], [("z", F, X3.shape)], opset)
    got = compile_and_run(m, {"x": X3}, tmp_path)
    np.testing.assert_array_equal(got[0], np.maximum(X3, 0))


def test_resize_10_is_asymmetric_nearest_floor(tmp_path):
    x = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    m = model([helper.make_node("Resize", ["x", "scales"], ["y"], mode="nearest")], [("x", F, x.shape)],
              [("y", F, (1, 1, 5, 5))], 10, inits=[("scales", np.array([1, 1, 1.7, 1.7], np.float32))])
    run_both(m, {"x": x}, tmp_path)


def test_scatter_9_is_scatter_elements(tmp_path):
    data = np.zeros((3, 3), np.float32)
    m = model([helper.make_node("Scatter", ["d", "i", "u"], ["y"], axis=1)],
              [("d", F, (3, 3)), ("i", TensorProto.INT64, (1, 2)), ("u", F, (1, 2))], [("y", F, (3, 3))], 9)
    run_both(m, {"d": data, "i": np.array([[1, 2]]), "u": np.array([[5.0, 6.0]], np.float32)}, tmp_path)


def test_since_version_follows_the_model_opset():
    node = Node("n", "Softmax", "", ["x"], ["y"], {})
    assert since_version(node, 9) == 1 and since_version(node, 12) == 11 and since_version(node, 13) == 13


def _cases():
    return sorted(glob.glob(os.path.join(DATA, "pytorch-*", "*", "model.onnx")))


def _read(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def test_pytorch_exported_models_of_opset_6_and_9(tmp_path):
    """All of the wheel's PyTorch-exported models (Add with ``broadcast``, Gemm with ``broadcast``,
    PRelu-6's per-channel slope, ...) compile and reproduce their recorded outputs."""
    cases = _cases()
    assert len(cases) > 100
    bad = []
    for path in cases:
        folder = os.path.dirname(path)
        m = onnx.load(path)
        inits = {t.name for t in m.graph.initializer}
        names = [i.name for i in m.graph.input if i.name not in inits]
        feed = {n: _read(p) for n, p in zip(names, sorted(glob.glob(f"{folder}/test_data_set_0/input_*.pb")))}
        want = [_read(p) for p in sorted(glob.glob(f"{folder}/test_data_set_0/output_*.pb"))]
        try:
            lib = str(tmp_path / "m.blob")
            compile_onnx(m, input_shapes={k: v.shape for k, v in feed.items()}).export_library(lib)
            with np.errstate(all="ignore"):
                got = run_in_process(lib, feed, len(want))
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True)
        except Exception as exc:
            bad.append(f"{os.path.basename(folder)}: {type(exc).__name__}: {str(exc)[:200]}")
    assert not bad, "\n".join(bad)
