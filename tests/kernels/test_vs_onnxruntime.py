"""Focused kernel tests against onnxruntime on shapes ONNX's own cases do not cover: conv with
groups/dilations/strides/odd sizes/auto_pad (1-D, 2-D, 3-D), pooling with ceil_mode and padding,
resize modes, gemm broadcasting, float16, and the fused-activation attrs."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import need_module

need_module("onnxruntime", "onnxruntime is the reference implementation here")
need_module("onnx", "models for onnxruntime are built with onnx.helper")

from kernels_ort import assert_close, ort_run  # noqa: E402

from rpcsrv.executor.kernels import KERNELS  # noqa: E402

RNG = np.random.default_rng(1234)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 7, 9), (4, 3, 3, 3), {}),
    ((2, 4, 11, 10), (6, 4, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 6, 13, 13), (6, 2, 3, 3), {"group": 3, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 8, 9, 9), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 4, 9, 9), (12, 1, 3, 3), {"group": 4, "auto_pad": "SAME_LOWER"}),  # depth multiplier 3
    ((1, 5, 10, 7), (3, 5, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [3, 2]}),
    ((1, 5, 10, 7), (3, 5, 2, 3), {"auto_pad": "VALID", "dilations": [3, 1]}),
    ((1, 16, 6, 6), (16, 4, 1, 1), {"group": 4}),
    ((2, 3, 17), (5, 3, 4), {"strides": [2], "pads": [1, 2]}),  # 1-D
    ((1, 2, 5, 6, 7), (4, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 0, 1]}),  # 3-D
    # the im2col layouts: flat stride-1 columns (2-D, 3-D, dilated, batched, asymmetric pads),
    # 1x1 without a copy, bias riding in the product (few rows, many positions)
    ((2, 5, 24, 23), (7, 5, 3, 3), {"pads": [1, 2, 0, 1]}),
    ((1, 4, 30, 30), (6, 4, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 3, 4, 20, 21), (5, 3, 2, 3, 3), {"pads": [0, 1, 1, 1, 1, 1]}),
    ((2, 8, 5, 6), (4, 8, 1, 1), {}),
    ((1, 3, 40, 40), (8, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 3, 32, 32), (8, 3, 7, 7), {"pads": [3, 3, 3, 3]}),
    ((1, 16, 4, 4), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs, ws, attrs", CONV_CASES)
def test_conv(xs, ws, attrs):
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    assert_close(KERNELS["conv"](x, w, b, **attrs), ort_run("Conv", [x, w, b], attrs)[0])


def test_conv_float16_and_fused_relu():
    x, w, b = rand(1, 4, 8, 8, dtype=np.float16), rand(6, 4, 3, 3, dtype=np.float16), rand(6, dtype=np.float16)
    got = KERNELS["conv"](x, w, b, pads=[1, 1, 1, 1], activation="relu")
    want = np.maximum(ort_run("Conv", [x, w, b], {"pads": [1, 1, 1, 1]})[0], 0)
    assert_close(got, want, rtol=1e-2, atol=1e-2)
    assert got.min() >= 0


@pytest.mark.parametrize("xs, ws, attrs", [
    ((1, 4, 20, 20), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # flat columns, cropped after relu
    ((1, 3, 30, 30), (8, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # bias in the GEMM
    ((1, 8, 6, 6), (4, 8, 1, 1), {}),  # 1x1: the input is the column matrix
])
def test_conv_fused_relu_layouts(xs, ws, attrs):
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    got = KERNELS["conv"](x, w, b, activation="relu", **attrs)
    assert_close(got, np.maximum(ort_run("Conv", [x, w, b], attrs)[0], 0))
    assert got.min() >= 0


def test_conv_non_contiguous_input_and_no_bias():
    x = rand(1, 18, 18, 5).transpose(0, 3, 1, 2)  # a strided view
    w = rand(6, 5, 3, 3)
    for attrs in ({"pads": [1, 1, 1, 1]}, {"strides": [2, 2]}, {}):
        assert_close(KERNELS["conv"](x, w, **attrs), ort_run("Conv", [np.ascontiguousarray(x), w], attrs)[0])
    w1 = rand(6, 5, 1, 1)
    assert_close(KERNELS["conv"](x, w1), ort_run("Conv", [np.ascontiguousarray(x), w1], {})[0])


@pytest.mark.parametrize("xs, attrs", [((1, 3, 6, 6), {}), ((1, 3, 20, 20), {"pads": [1, 1, 1, 1]})])
def test_conv_fused_clip_with_attrs(xs, attrs):
    x, w = rand(*xs), rand(4, 3, 3, 3)
    got = KERNELS["conv"](x, w, activation="clip", activation_attrs={"min": -0.5, "max": 0.5}, **attrs)
    assert_close(got, np.clip(ort_run("Conv", [x, w], attrs)[0], -0.5, 0.5))


@pytest.mark.parametrize("xs, ws, attrs", [
    ((1, 4, 5, 5), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 4, 4, 6), (4, 2, 2, 3), {"group": 2, "dilations": [2, 1]}),
])
def test_conv_transpose(xs, ws, attrs):
    x, w = rand(*xs), rand(*ws)
    assert_close(KERNELS["conv_transpose"](x, w, **attrs), ort_run("ConvTranspose", [x, w], attrs)[0])


POOL_CASES = [
    ("MaxPool", (1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 2, 10, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 2, 0, 1]}),
    ("AveragePool", (1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                   "count_include_pad": 1}),
    ("AveragePool", (1, 2, 10, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1,
                                    "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [3, 3], "auto_pad": "SAME_LOWER"}),
    ("AveragePool", (1, 2, 11), {"kernel_shape": [4], "strides": [3], "ceil_mode": 1}),
    ("GlobalAveragePool", (2, 5, 7, 3), {}),
    ("GlobalMaxPool", (2, 5, 7, 3), {}),
]


@pytest.mark.parametrize("op, xs, attrs", POOL_CASES)
def test_pool(op, xs, attrs):
    from rpcsrv.executor.kernels import onnx_op_to_kernel

    x = rand(*xs)
    assert_close(KERNELS[onnx_op_to_kernel(op)](x, **attrs), ort_run(op, [x], attrs)[0])


RESIZE_CASES = [
    ({"mode": "nearest"}, [1, 1, 2, 2.5], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 3, 3], None),
    ({"mode": "linear"}, [1, 1, 0.5, 0.75], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 9, 5]),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [2, 3, 1, 12]),
    ({"mode": "cubic"}, [1, 1, 1.5, 2], None),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, None, [2, 3, 4, 4]),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 7.0}, None, [2, 3, 5, 5]),
]


@pytest.mark.parametrize("attrs, scales, sizes", RESIZE_CASES)
def test_resize(attrs, scales, sizes):
    x = rand(2, 3, 6, 7)
    roi = np.array([0, 0, -0.1, 0.2, 1, 1, 0.9, 1.3], np.float32) if "tf_crop_and_resize" in str(attrs) else None
    sc = None if scales is None else np.array(scales, np.float32)
    sz = None if sizes is None else np.array(sizes, np.int64)
    assert_close(KERNELS["resize"](x, roi, sc, sz, **attrs), ort_run("Resize", [x, roi, sc, sz], attrs)[0])


@pytest.mark.parametrize("a_shape, b_shape, c_shape, attrs", [
    ((4, 5), (5, 3), (3,), {}),
    ((5, 4), (3, 5), (4, 1), {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
    ((4, 5), (5, 3), (), {"beta": -1.0}),
    ((4, 5), (5, 3), None, {}),
])
def test_gemm(a_shape, b_shape, c_shape, attrs):
    a, b = rand(*a_shape), rand(*b_shape)
    c = None if c_shape is None else rand(*c_shape)
    assert_close(KERNELS["gemm"](a, b, c, **attrs), ort_run("Gemm", [a, b, c], attrs)[0])


def test_gemm_fused_relu_and_matmul_broadcast():
    a, b, c = rand(6, 8), rand(8, 4), rand(4)
    got = KERNELS["gemm"](a, b, c, activation="relu")
    assert_close(got, np.maximum(ort_run("Gemm", [a, b, c], {})[0], 0))
    x, y = rand(2, 1, 5, 8), rand(3, 8, 6)
    assert_close(KERNELS["matmul"](x, y), ort_run("MatMul", [x, y], {})[0])
    h = rand(2, 4, 16, dtype=np.float16)
    wt = rand(16, 8, dtype=np.float16)
    assert_close(KERNELS["matmul"](h, wt), ort_run("MatMul", [h, wt], {})[0], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("a_shape, b_shape, c_shape", [
    ((1, 16, 8), (8, 12), (12,)), ((2, 3, 5, 8), (8, 4), (1, 1, 4)), ((3, 8), (8, 5), (3, 5)),
    ((4, 6, 8), (4, 8, 6), (4, 1, 6)), ((8,), (8, 3), (3,)),
])
def test_matmul_with_bias_input(a_shape, b_shape, c_shape):
    a, b, c = rand(*a_shape), rand(*b_shape), rand(*c_shape)
    want = ort_run("Add", [ort_run("MatMul", [a, b], {})[0], c], {})[0]
    assert_close(KERNELS["matmul"](a, b, c), want)
    assert_close(KERNELS["matmul"](a, b, c, activation="relu"), np.maximum(want, 0))


def test_matmul_bias_must_not_grow_the_product():
    with pytest.raises(ValueError, match="does not broadcast"):
        KERNELS["matmul"](rand(2, 3), rand(3, 4), rand(5, 2, 4))
    with pytest.raises(ValueError, match="does not broadcast"):
        KERNELS["matmul"](rand(2, 3), rand(3, 4), rand(4).astype(np.float64))


@pytest.mark.parametrize("op, inputs, attrs", [
    ("LayerNormalization", lambda: [rand(2, 7, 16), rand(16), rand(16)], {"epsilon": 1e-6}),
    ("LayerNormalization", lambda: [rand(2, 7, 16, dtype=np.float16), rand(16, dtype=np.float16),
                                    rand(16, dtype=np.float16)], {}),
    ("Softmax", lambda: [rand(2, 4, 7, 7) * 30], {"axis": -1}),
    ("Gelu", lambda: [rand(3, 50) * 4], {}),
    ("Erf", lambda: [rand(3, 50) * 3], {}),
    ("Where", lambda: [RNG.random((3, 1, 5)) > 0.5, rand(4, 5), rand(3, 4, 1)], {}),
    ("Expand", lambda: [rand(3, 1), np.array([2, 1, 4])], {}),
    ("Gather", lambda: [rand(50, 8), np.array([[0, 49, -1], [3, 3, 7]])], {}),
    ("Pow", lambda: [np.abs(rand(4, 5)), np.array(0.5, np.float32)], {}),
    ("Div", lambda: [np.array([7, -7, 7, -7, 0], np.int64), np.array([2, 2, -2, -2, 3], np.int64)], {}),
    ("BatchNormalization", lambda: [rand(2, 3, 4, 5), rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.1], {}),
    ("InstanceNormalization", lambda: [rand(2, 3, 4, 5), rand(3), rand(3)], {}),
    ("Pad", lambda: [rand(2, 3, 4), np.array([0, 1, -1, 0, 2, 2]), np.array(1.5, np.float32)], {}),
    ("Pad", lambda: [rand(2, 3, 4), np.array([0, 2, 1, 0, 1, 3])], {"mode": "reflect"}),
    ("Slice", lambda: [rand(5, 6, 7), np.array([4, -100, 1]), np.array([-100, 100, 6]),
                       np.array([0, 1, 2]), np.array([-2, 3, 2])], {}),
    ("ReduceMean", lambda: [rand(3, 4, 5), np.array([0, -1])], {"keepdims": 0}),
    ("CumSum", lambda: [rand(3, 4), np.array(1)], {"exclusive": 1, "reverse": 1}),
])
def test_transformer_and_misc_ops(op, inputs, attrs):
    from rpcsrv.executor.kernels import onnx_op_to_kernel

    args = inputs()
    n_out = 1
    got = KERNELS[onnx_op_to_kernel(op)](*args, **attrs)
    got = got[0] if isinstance(got, tuple) else got
    want = ort_run(op, args, attrs, n_out)[0]
    tol = 1e-2 if got.dtype == np.float16 else 1e-5
    assert_close(got, want, rtol=tol, atol=tol)


def test_quantized_conv_and_matmul_per_channel():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 255, (1, 4, 7, 6), dtype=np.uint8)
    # small weights: ORT's u8s8 kernels on AVX2 saturate pairwise int16 sums of large products
    w = rng.integers(-60, 60, (6, 4, 3, 3), dtype=np.int8)
    args = [x, np.array(0.02, np.float32), np.array(128, np.uint8),
            w, (rng.random(6) * 0.01 + 0.001).astype(np.float32), np.zeros(6, np.int8),
            np.array(0.15, np.float32), np.array(120, np.uint8), rng.integers(-500, 500, 6).astype(np.int32)]
    attrs = {"pads": [1, 0, 1, 2], "strides": [2, 1]}
    got = KERNELS["q_linear_conv"](*args, **attrs)
    want = ort_run("QLinearConv", args, attrs)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1  # ORT may requantize in float32
    a = rng.integers(-128, 127, (5, 9), dtype=np.int8)
    b = rng.integers(-128, 127, (9, 3), dtype=np.int8)
    margs = [a, np.array(0.05, np.float32), np.array(3, np.int8), b, np.array(0.03, np.float32),
             np.array(-2, np.int8), np.array(0.4, np.float32), np.array(5, np.int8)]
    got = KERNELS["q_linear_matmul"](*margs)
    want = ort_run("QLinearMatMul", margs, {})[0]
    assert got.dtype == want.dtype and np.abs(got.astype(int) - want.astype(int)).max() <= 1
    got = KERNELS["matmul_integer"](a, b, np.array(3, np.int8), np.array(-2, np.int8))
    assert_close(got, ort_run("MatMulInteger", [a, b, np.array(3, np.int8), np.array(-2, np.int8)], {})[0])


@pytest.mark.parametrize("xs, attrs", [
    ((1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 2, 7, 5), {"kernel_shape": [2, 3], "storage_order": 1, "ceil_mode": 1, "strides": [2, 2]}),
    ((2, 3, 11), {"kernel_shape": [3], "dilations": [2], "pads": [2, 1]}),
])
def test_max_pool_indices(xs, attrs):
    """MaxPool's optional Indices output (flat index into x; column-major spatial with storage_order=1)."""
    from rpcsrv.executor.kernels import KERNELS

    x = np.random.default_rng(5).integers(-3, 4, xs).astype(np.float32)  # small ints: many ties
    want_y, want_i = ort_run("MaxPool", [x], attrs, n_outputs=2)
    got_y, got_i = KERNELS["max_pool"](x, return_indices=1, **attrs)
    assert_close(got_y, want_y)
    np.testing.assert_array_equal(got_i, want_i)
