"""MaxPool / AveragePool through every path of ``pool._pool_reduce`` against ``onnx.reference``.

The paths: non-last dims reduced at their kept positions straight from the input (strided, rows of at
least ``ROW_MIN`` values), or padded and shifted over the flattened buffer (short rows, stride 1); the last
dim shifted, with the edge columns whose windows reach into the padding recomputed from their valid taps.
Each case is run with and without the kept-position path (``ROW_MIN`` patched), over pads, ceil_mode,
dilations, count_include_pad, auto_pad, 1-D/2-D/3-D inputs, float16 and integer inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from rpcsrv.executor.kernels.pool import pool

ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
        np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int8): TensorProto.INT8,
        np.dtype(np.uint8): TensorProto.UINT8}


def reference(op: str, x: np.ndarray, **attrs) -> np.ndarray:
    """``onnx.reference``'s MaxPool/AveragePool on ``x`` (float inputs run in float64).

    onnx.reference gets SAME_LOWER's output shape wrong (5 for 11 at stride 2, not ceil(11/2) = 6), so
    SAME_LOWER runs as the explicit pads the spec defines: total = (out - 1) * stride + kernel - in, the
    larger half first.
    """
    if attrs.get("auto_pad") == "SAME_LOWER":
        attrs = dict(attrs, auto_pad="NOTSET")
        total = [max(0, (-(-n // s) - 1) * s + k - n) for n, s, k in zip(x.shape[2:], attrs["strides"],
                                                                     attrs["kernel_shape"])]
        attrs["pads"] = [t - t // 2 for t in total] + [t // 2 for t in total]
    xr = x.astype(np.float64) if x.dtype.kind == "f" else x
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", ELEM[xr.dtype], None)],
                              [helper.make_tensor_value_info("y", ELEM[xr.dtype], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(onnx.shape_inference.infer_shapes(model)).run(None, {"x": xr})[0]


CASES = [  # (input shape, attributes): 3x3/2 like ShuffleNet and ResNet, wide rows (kept path) and short ones
    # (onnx.reference mis-shapes or fails on 1-D pools at stride 1 with pads and on size-1 kernel dims with pads)
    ((1, 3, 9, 70), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((2, 5, 14, 14), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 4, 11, 66), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ((1, 4, 12, 13), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 2, 1, 0])),
    ((1, 4, 13, 13), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((1, 4, 8, 68), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 4, 9, 9), dict(kernel_shape=[2, 3], strides=[3, 2], pads=[1, 0, 0, 1], ceil_mode=1)),
    ((1, 2, 10, 70), dict(kernel_shape=[3, 3], strides=[2, 3], pads=[2, 2, 2, 2], dilations=[2, 2])),
    ((1, 2, 11, 11), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 0, 1], dilations=[2, 3], ceil_mode=1)),
    ((1, 3, 7, 7), dict(kernel_shape=[7, 7])),
    ((1, 3, 10, 67), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 3, 10, 11), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER")),
    ((1, 3, 10, 11), dict(kernel_shape=[4, 4], strides=[3, 3], auto_pad="SAME_UPPER")),
    ((1, 3, 10, 11), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID")),
    ((1, 3, 3, 3), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[2, 2, 2, 2])),
    ((2, 3, 20), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((2, 3, 22), dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
    ((1, 2, 7, 6, 12), dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])),
    ((1, 2, 5, 8, 9), dict(kernel_shape=[2, 3, 3], strides=[1, 2, 1], pads=[0, 1, 1, 1, 0, 1], ceil_mode=1)),
    # halved by ``_halve``: images in a batch, the smallest size, no end pads, windows from the output
    # position (Caffe's end padding), one dim each way
    ((2, 3, 6, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((3, 2, 4, 2), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((2, 4, 4, 4), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0])),
    ((2, 3, 8, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ((1, 2, 6, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 2, 2, 2), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    # same size, 3x3 stride 1 pad 1 (``_same3``): batches, the smallest size, wide and narrow
    ((2, 3, 5, 2), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((1, 2, 2, 9), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
]


def ids(case):
    shape, attrs = case
    return "x".join(map(str, shape)) + "-" + "-".join(f"{k}{v}" for k, v in attrs.items()).replace(" ", "")


@pytest.fixture(params=[64, 1], ids=["rows64", "kept-always"])
def row_min(request, monkeypatch):
    """Run each case with the shipped threshold and with the kept-position path for every strided dim."""
    monkeypatch.setattr(pool, "ROW_MIN", request.param)


@pytest.mark.parametrize("case", CASES, ids=[ids(c) for c in CASES])
def test_max_pool(case, row_min):
    shape, attrs = case
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(pool.max_pool(x, **attrs), reference("MaxPool", x, **attrs).astype(np.float32))


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize("case", CASES, ids=[ids(c) for c in CASES])
def test_average_pool(case, include, row_min):
    shape, attrs = case
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    got = pool.average_pool(x, count_include_pad=include, **attrs)
    np.testing.assert_allclose(got, reference("AveragePool", x, count_include_pad=include, **attrs),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16])
def test_max_pool_dtypes(dtype, row_min):
    shape, attrs = (1, 3, 9, 70), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    rng = np.random.default_rng(4)
    x = rng.integers(0, 100, shape).astype(dtype) if np.dtype(dtype).kind != "f" else rng.standard_normal(shape)
    x = x.astype(dtype)
    got = pool.max_pool(x, **attrs)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, reference("MaxPool", x, **attrs).astype(dtype))


def test_average_pool_float16(row_min):
    shape, attrs = (1, 3, 9, 70), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float16)
    got = pool.average_pool(x, **attrs)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), reference("AveragePool", x, **attrs), rtol=2e-3, atol=2e-3)


def test_the_common_3x3_pools_take_the_whole_buffer_paths(monkeypatch):
    """3x3/2 pools of even sizes go through ``_halve``, 3x3/1 pad 1 ones through ``_same3`` (the cases above
    check their values); odd sizes, other windows, strides and pads, and MaxPool with indices do not."""
    seen = []
    for name in ("_halve", "_same3"):
        real = getattr(pool, name)
        monkeypatch.setattr(pool, name, lambda x, *a, real=real, name=name: seen.append(name) or real(x, *a))
    x = np.ones((1, 2, 8, 8), np.float32)
    pool.average_pool(x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    pool.max_pool(x, kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])
    pool.average_pool(x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    pool.max_pool(x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    assert seen == ["_halve", "_halve", "_same3", "_same3"]
    pool.average_pool(x, kernel_shape=[2, 2], strides=[2, 2])
    pool.average_pool(np.ones((1, 2, 9, 9), np.float32), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    pool.average_pool(x, kernel_shape=[3, 3], strides=[1, 1], pads=[0, 0, 2, 2])
    pool.max_pool(x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], return_indices=1)
    assert len(seen) == 4
