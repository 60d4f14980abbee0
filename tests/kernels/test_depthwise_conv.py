"""Depthwise convolution (``kernels.depthwise``, reached through ``conv`` when group == C) against ONNX's
own reference implementation (``onnx.reference``, in float64) on random data: strides 1-3 (column
phases and computed-then-kept columns), dilations, asymmetric pads, auto_pad, channel multipliers,
batches, odd sizes, 1-D, bias, fused relu, float16/float64, and the prepared-weight cache.  These test the
numpy kernels, the fallback every board has: the compiled kernel is turned off here (its own tests, on the
same cases: ``test_compiled_depthwise.py``)."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from rpcsrv.executor.kernels.conv import depthwise
from rpcsrv.executor.kernels import prepared
from rpcsrv.executor.kernels.conv.conv import conv


@pytest.fixture(autouse=True)
def numpy_kernels(monkeypatch):
    """Every test here runs the numpy depthwise kernels (``RPCSRV_COMPILED_KERNELS=0``)."""
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")


def onnx_conv(x, w, b=None, **attrs):
    """ONNX Conv by onnx.reference, in float64."""
    names = ["x", "w"] + ([] if b is None else ["b"])
    node = helper.make_node("Conv", names, ["y"], **{k: v for k, v in attrs.items() if v is not None})
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.DOUBLE, None)
                                            for n in names],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": x.astype(np.float64), "w": w.astype(np.float64)}
    if b is not None:
        feeds["b"] = b.astype(np.float64)
    return ReferenceEvaluator(model).run(None, feeds)[0]


CASES = [  # (n, c, mult, spatial, kernel, strides, dilations, pads)
    (1, 8, 1, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 6, 1, (12, 10), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # stride 2, even sizes
    (2, 5, 1, (11, 13), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # batch, odd sizes
    (1, 4, 1, (10, 11), (3, 3), (3, 3), (1, 1), (1, 1, 1, 1)),  # stride 3
    (1, 4, 1, (13, 12), (3, 3), (5, 5), (1, 1), (2, 2, 2, 2)),  # stride 5: every column computed
    (1, 4, 1, (9, 14), (3, 3), (1, 2), (1, 1), (1, 1, 1, 1)),  # strides differ per dim
    (1, 7, 1, (12, 12), (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),  # dilation
    (1, 3, 1, (15, 14), (3, 3), (2, 2), (2, 3), (0, 1, 2, 3)),  # dilation with stride, asymmetric pads
    (1, 5, 1, (8, 9), (3, 3), (1, 1), (1, 1), (0, 2, 1, 0)),  # asymmetric pads
    (1, 5, 1, (8, 9), (3, 3), (1, 1), (1, 1), (0, 0, 0, 0)),  # no pads
    (1, 4, 2, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # multiplier 2 (M = 2C)
    (2, 3, 3, (10, 7), (3, 3), (2, 1), (1, 1), (1, 0, 1, 2)),  # multiplier 3, batch, stride per dim
    (1, 6, 1, (7, 7), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),  # 5x5
    (1, 6, 1, (9, 8), (1, 3), (1, 2), (1, 1), (0, 1, 0, 1)),  # 1x3
    (1, 2, 1, (3, 3), (3, 3), (1, 1), (1, 1), (0, 0, 0, 0)),  # one output
    (1, 300, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # long rows: one output row per weight row
    (1, 24, 1, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # short rows: several rows per weight row
    (1, 40, 1, (29, 31), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # wide: column phases by default
    (2, 5, 1, (21, 24), (3, 3), (2, 2), (2, 1), (0, 1, 2, 0)),
    (2, 6, 1, (17,), (3,), (1,), (1,), (1, 1)),  # 1-D
    (1, 4, 2, (20,), (5,), (2,), (2,), (3, 1)),  # 1-D: stride, dilation, multiplier, asymmetric pads
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("phases", ["column phases", "every column"])
@pytest.mark.parametrize("einsum", [True, False])
def test_depthwise_matches_onnx_reference(case, bias, phases, einsum, monkeypatch):
    monkeypatch.setattr(depthwise, "PHASE_MIN_WIDTH", 0 if phases == "column phases" else 10**9)
    monkeypatch.setattr(depthwise, "EINSUM", einsum)
    n, c, mult, spatial, kernel, strides, dilations, pads = case
    rng = np.random.default_rng(len(CASES) * bias + CASES.index(case))
    x = rng.standard_normal((n, c) + spatial).astype(np.float32)
    w = rng.standard_normal((c * mult, 1) + kernel).astype(np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32) if bias else None
    want = onnx_conv(x, w, b, group=c, strides=list(strides), dilations=list(dilations), pads=list(pads))
    got = conv(x, w, b, group=c, strides=list(strides), dilations=list(dilations), pads=list(pads))
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_auto_pad(auto_pad, stride):
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((1, 6, 10, 9)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    want = onnx_conv(x, w, group=6, strides=[stride] * 2, auto_pad=auto_pad)
    got = conv(x, w, group=6, strides=[stride] * 2, auto_pad=auto_pad)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_depthwise_fused_relu_and_other_dtypes():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 12, 9, 9))
    w = rng.standard_normal((12, 1, 3, 3))
    b = rng.standard_normal(12)
    want = onnx_conv(x, w, b, group=12, pads=[1] * 4, strides=[2, 2])
    relu = conv(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), group=12, pads=[1] * 4,
                strides=[2, 2], activation="relu")
    np.testing.assert_allclose(relu, np.maximum(want, 0), rtol=1e-5, atol=1e-5)
    assert relu.min() == 0 and (want < 0).any()
    exact = conv(x, w, b, group=12, pads=[1] * 4, strides=[2, 2])  # float64 stays float64
    assert exact.dtype == np.float64
    np.testing.assert_allclose(exact, want, rtol=1e-12, atol=1e-12)
    half = conv(x.astype(np.float16), w.astype(np.float16), b.astype(np.float16), group=12, pads=[1] * 4,
                strides=[2, 2])  # computed in float32, rounded once
    want16 = onnx_conv(x.astype(np.float16), w.astype(np.float16), b.astype(np.float16), group=12,
                       pads=[1] * 4, strides=[2, 2])
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float64), want16, rtol=2e-3, atol=2e-3)


def test_depthwise_empty_batch():
    for shape in [(0, 4, 5, 5), (0, 4, 9)]:
        w = np.ones((8, 1) + (3,) * (len(shape) - 2), np.float32)
        got = conv(np.ones(shape, np.float32), w, np.ones(8, np.float32), group=4, pads=[1] * (2 * len(shape) - 4))
        assert got.shape == (0, 8) + shape[2:]


def test_conv_routes_depthwise_layers_and_reuses_prepared_weights(monkeypatch):
    calls = []
    real = depthwise.depthwise_conv
    monkeypatch.setattr("rpcsrv.executor.kernels.conv.conv.depthwise_conv",
                        lambda *a: calls.append(a[0].shape) or real(*a))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    b1, b2 = np.ones(16, np.float32), np.full(16, 2, np.float32)
    y1 = conv(x, w, b1, group=16, pads=[1] * 4)
    y2 = conv(x, w, b2, group=16, pads=[1] * 4)  # same weights, another bias: not the cached one
    y0 = conv(x, w, None, group=16, pads=[1] * 4)
    np.testing.assert_allclose(y1 - y0, 1, atol=1e-5)
    np.testing.assert_allclose(y2 - y0, 2, atol=1e-5)
    y3 = conv(x[:, :, :9, :11], w, b1, group=16, pads=[1] * 4)  # another geometry, same weights
    np.testing.assert_allclose(y3, onnx_conv(x[:, :, :9, :11], w, b1, group=16, pads=[1] * 4), rtol=1e-5,
                               atol=1e-5)
    assert len(calls) == 4
    assert 1 <= prepared.entries(w) <= prepared.MAX_PER_ARRAY
    for side in range(3, 3 + 2 * prepared.MAX_PER_ARRAY):  # many geometries: the entry stays bounded
        conv(x[:, :, :side, :side], w, None, group=16, pads=[1] * 4)
        assert prepared.entries(w) <= prepared.MAX_PER_ARRAY
    del w
    gc.collect()
    assert all(ref() is not None for ref, _ in prepared._cache.values())  # dropped with its weights


@pytest.mark.parametrize("n,c,m,group,side", [
    (1, 8, 24, 1, 7), (2, 8, 24, 1, 5), (1, 24, 8, 1, 7),  # ungrouped 1x1: widening (bias in the GEMM), narrowing
    (1, 24, 112, 4, 9), (2, 12, 12, 4, 6), (1, 16, 8, 4, 5),  # grouped 1x1 (ShuffleNet's), the same
])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_pointwise_conv_bias_in_the_product(n, c, m, group, side, activation):
    """1x1 convs whose columns are the input itself: the bias rides in the GEMM through a ones row per
    group when the conv does not narrow, else it is added after; both against onnx.reference."""
    rng = np.random.default_rng(c * m + group)
    x = rng.standard_normal((n, c, side, side)).astype(np.float32)
    w = rng.standard_normal((m, c // group, 1, 1)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    want = onnx_conv(x, w, b, group=group)
    want = np.maximum(want, 0) if activation else want
    for _ in range(2):  # the second call uses the cached weights-with-bias
        got = conv(x, w, b, group=group, activation=activation)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    got = conv(x, w, b + 1, group=group)  # same weights, another bias
    np.testing.assert_allclose(got, onnx_conv(x, w, b + 1, group=group), rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_weights_overwritten_in_place_are_not_served_stale():
    """A weight that is a subgraph input is a storage buffer that set_input overwrites in place: the same
    array object with new values must give the new result (the prepared-weight cache compares values)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    for changed in (w, b):  # the weights, then the bias
        conv(x, w, b, group=8, pads=[1] * 4)
        changed[...] = rng.standard_normal(changed.shape)
        np.testing.assert_allclose(conv(x, w, b, group=8, pads=[1] * 4),
                                   onnx_conv(x, w, b, group=8, pads=[1] * 4), rtol=1e-5, atol=1e-5)
    wp = rng.standard_normal((16, 2, 1, 1)).astype(np.float32)  # grouped 1x1, bias in the product
    conv(x, wp, b.repeat(2), group=4)
    wp[...] = rng.standard_normal(wp.shape)
    np.testing.assert_allclose(conv(x, wp, b.repeat(2), group=4), onnx_conv(x, wp, b.repeat(2), group=4),
                               rtol=1e-5, atol=1e-5)


def test_depthwise_bench_smoke(capsys):
    """bench/depthwise_bench.py runs (one round, no timing asserts) and checks its variants agree."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import depthwise_bench

    assert depthwise_bench.main(["--repeat", "1", "--cold-heap"]) == 0
    out = capsys.readouterr().out
    assert "| 136 | 28x28 | 1 |" in out and "ShuffleNet's 16 depthwise layers" in out


@pytest.mark.parametrize("view", ["reversed columns", "transposed", "channel shuffle"])
def test_depthwise_reads_any_input_view(view):
    """The layout copy takes whole rows as single elements when the input's rows are contiguous, and
    falls back to a plain copy when they are not: both give the reference result."""
    rng = np.random.default_rng(5)
    base = rng.standard_normal((1, 8, 9, 10)).astype(np.float32)
    x = {"reversed columns": base[..., ::-1],
         "transposed": base.transpose(0, 1, 3, 2),
         "channel shuffle": base.reshape(1, 2, 4, 9, 10).transpose(0, 2, 1, 3, 4).reshape(1, 8, 9, 10)}[view]
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    for stride in (1, 2):
        want = onnx_conv(np.ascontiguousarray(x), w, group=8, pads=[1] * 4, strides=[stride] * 2)
        np.testing.assert_allclose(conv(x, w, group=8, pads=[1] * 4, strides=[stride] * 2), want, rtol=1e-5,
                                   atol=1e-5)
