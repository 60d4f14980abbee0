"""The heavier host ops (client/compiler/hostops.py): Gemm, MatMul, BatchNormalization,
LayerNormalization, Gather and Resize, compiled to C, run in process and compared with onnxruntime;
and what the host C covers of the ops the board's executor runs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import need_module
from rpcsrv.client.compiler import CompileError
from rpcsrv.client.compiler.hostgen import HOST_OPS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hostgen import _model, _run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import reference  # noqa: E402

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
RNG = np.random.default_rng(7)


def _check(model, feed, tmp_path, rtol=1e-5, atol=1e-5):
    need_module("onnxruntime")
    got, want = _run(model, feed, tmp_path), reference(model, feed)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("ta,tb,c", [(0, 0, [5]), (1, 0, [3, 5]), (0, 1, [1, 5]), (1, 1, None), (0, 0, [3, 1])])
def test_gemm(tmp_path, ta, tb, c):
    a, b = ([4, 3] if ta else [3, 4]), ([5, 4] if tb else [4, 5])
    inputs = [("a", a, F), ("b", b, F)] + ([("c", c, F)] if c else [])
    node = helper.make_node("Gemm", [i[0] for i in inputs], ["y"], alpha=0.5, beta=2.0, transA=ta, transB=tb)
    model = _model([node], inputs, [("y", [3, 5], F)])
    _check(model, {name: _rand(*shape) for name, shape, _ in inputs}, tmp_path)


@pytest.mark.parametrize("a,b", [([3, 4], [4, 5]), ([2, 3, 4], [4, 5]), ([2, 1, 3, 4], [3, 4, 2]), ([4], [4, 5]),
                                 ([3, 4], [4]), ([2, 3, 4], [2, 4, 6])])
def test_matmul_broadcasts_batches_and_vectors(tmp_path, a, b):
    out = list(np.matmul(np.zeros(a), np.zeros(b)).shape)
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", a, F), ("b", b, F)], [("y", out, F)])
    _check(model, {"a": _rand(*a), "b": _rand(*b)}, tmp_path)


@pytest.mark.parametrize("shape", [[2, 3, 4, 5], [2, 3], [1, 4, 7]])
def test_batch_normalization(tmp_path, shape):
    c = shape[1]
    stats = {"s": _rand(c), "b": _rand(c), "m": _rand(c), "v": np.abs(_rand(c)) + 0.1}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)
    model = _model([node], [("x", shape, F)] + [(k, [c], F) for k in stats], [("y", shape, F)])
    _check(model, {"x": _rand(*shape), **stats}, tmp_path)


@pytest.mark.parametrize("axis,bias", [(-1, True), (1, True), (-1, False)])
def test_layer_normalization(tmp_path, axis, bias):
    shape = [2, 3, 8]
    norm = shape[axis:] if axis != -1 else shape[-1:]
    inputs = [("x", shape, F), ("s", norm, F)] + ([("b", norm, F)] if bias else [])
    node = helper.make_node("LayerNormalization", [i[0] for i in inputs], ["y"], axis=axis, epsilon=1e-4)
    model = _model([node], inputs, [("y", shape, F)])
    _check(model, {name: _rand(*s) for name, s, _ in inputs}, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis,ishape,dtype", [(0, [3], I64), (1, [2, 2], I32), (2, [], I64), (0, [4], I32)])
def test_gather_any_axis_negative_indices(tmp_path, axis, ishape, dtype):
    data = [5, 4, 3]
    out = data[:axis] + ishape + data[axis + 1:]
    model = _model([helper.make_node("Gather", ["d", "i"], ["y"], axis=axis)], [("d", data, F), ("i", ishape, dtype)],
                   [("y", out, F)])
    np_dtype = "int64" if dtype == I64 else "int32"
    idx = RNG.integers(-data[axis], data[axis], size=ishape).astype(np_dtype)
    _check(model, {"d": _rand(*data), "i": idx}, tmp_path)


def test_gather_out_of_range_is_an_error_not_a_read(tmp_path):
    model = _model([helper.make_node("Gather", ["d", "i"], ["y"])], [("d", [3, 2], F), ("i", [2], I64)],
                   [("y", [2, 2], F)])
    with pytest.raises(Exception, match="index out of range"):
        _run(model, {"d": _rand(3, 2), "i": np.array([0, 3], "int64")}, tmp_path)


RESIZE = [({"mode": "nearest"}, [1, 1, 2, 2], None), ({"mode": "nearest", "nearest_mode": "floor",
           "coordinate_transformation_mode": "asymmetric"}, [1, 1, 2, 3], None),
          ({"mode": "linear"}, [1, 1, 2, 2], None), ({"mode": "linear"}, [1, 1, 0.5, 0.75], None),
          ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 9, 5]),
          ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [2, 3, 1, 7]),
          ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 1.5, 2.5], None),
          ({"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "align_corners"}, None,
           [2, 3, 7, 3])]


@pytest.mark.parametrize("attrs,scales,sizes", RESIZE)
def test_resize(tmp_path, attrs, scales, sizes):
    ishape = [2, 3, 4, 6]
    oshape = sizes or [int(np.floor(d * s)) for d, s in zip(ishape, scales)]
    inits = {"roi": np.zeros(0, "float32")}
    names = ["x", "roi"]
    if scales:
        inits["scales"] = np.array(scales, "float32")
        names.append("scales")
    else:
        inits.update(scales=np.zeros(0, "float32"), sizes=np.array(sizes, "int64"))
        names += ["scales", "sizes"]
    model = _model([helper.make_node("Resize", names, ["y"], **attrs)], [("x", ishape, F)], [("y", oshape, F)],
                   inits=inits, opset=13)
    _check(model, {"x": _rand(*ishape)}, tmp_path)


def test_resize_cubic_is_refused_with_the_reason(tmp_path):
    model = _model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic")], [("x", [1, 1, 2, 2], F)],
                   [("y", [1, 1, 4, 4], F)], inits={"s": np.array([1, 1, 2, 2], "float32")}, opset=13)
    with pytest.raises(CompileError, match="Resize mode 'cubic' has no host implementation"):
        _run(model, {"x": _rand(1, 1, 2, 2)}, tmp_path)


@pytest.mark.parametrize("kind,attrs,scale", [
    ("Tan", {}, 1), ("Asin", {}, 0.9), ("Acos", {}, 0.9), ("Atan", {}, 3), ("Sinh", {}, 2), ("Cosh", {}, 2),
    ("Asinh", {}, 3), ("Atanh", {}, 0.9), ("Sign", {}, 2), ("Round", {}, 3), ("Softsign", {}, 3), ("Mish", {}, 3),
    ("Selu", {}, 2), ("Selu", {"alpha": 1.5, "gamma": 0.5}, 2), ("Celu", {"alpha": 0.7}, 2),
    ("ThresholdedRelu", {"alpha": 0.3}, 2)])
def test_more_unary(tmp_path, kind, attrs, scale):
    model = _model([helper.make_node(kind, ["x"], ["y"], **attrs)], [("x", [4, 6], F)], [("y", [4, 6], F)],
                   opset=18)
    x = (np.tanh(_rand(4, 6)) * 0.95 if scale < 1 else _rand(4, 6) * scale).astype("float32")  # in every domain
    if kind == "Round":
        x[0, :3] = [0.5, 1.5, -2.5]  # halves round to even
    _check(model, {"x": x}, tmp_path, rtol=1e-5, atol=1e-6)


def test_acosh_above_one(tmp_path):
    model = _model([helper.make_node("Acosh", ["x"], ["y"])], [("x", [5], F)], [("y", [5], F)])
    _check(model, {"x": np.abs(_rand(5)) + 1.0}, tmp_path)


def test_host_covers_the_heavy_ops_a_vendor_lacks():
    """The ops the issue names are covered, and the coverage against the ONNX ops the board's executor
    runs is what docs/examplejson.md reports."""
    from rpcsrv.client.compiler.coverage import host_coverage
    assert {"Gemm", "MatMul", "BatchNormalization", "Resize", "Gather", "LayerNormalization"} <= set(HOST_OPS)
    covered, missing = host_coverage()
    assert set(covered) <= set(HOST_OPS) and not set(missing) & set(HOST_OPS)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "examplejson.md").read_text()
    assert f"{len(covered)} of the {len(covered) + len(missing)}" in doc
