"""The kernel table's contract: naming rule, attribute checking, registration, error messages."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor.kernels import KERNELS, SUPPORTED_OPS, onnx_op_to_kernel, register


@pytest.mark.parametrize("op_type, name", [
    ("Add", "add"), ("Conv", "conv"), ("MatMul", "matmul"), ("Gemm", "gemm"),
    ("BatchNormalization", "batch_normalization"), ("GlobalAveragePool", "global_average_pool"),
    ("LayerNormalization", "layer_normalization"), ("LeakyRelu", "leaky_relu"),
    ("HardSigmoid", "hard_sigmoid"), ("ReduceMean", "reduce_mean"), ("LogSoftmax", "log_softmax"),
    ("ReduceLogSumExp", "reduce_log_sum_exp"), ("ReduceL2", "reduce_l2"), ("LRN", "lrn"),
    ("PRelu", "prelu"), ("DepthToSpace", "depth_to_space"), ("TopK", "top_k"), ("IsNaN", "is_nan"),
    ("ConvTranspose", "conv_transpose"), ("ArgMax", "arg_max"), ("CumSum", "cum_sum"),
])
def test_naming_rule(op_type, name):
    assert onnx_op_to_kernel(op_type) == name


def test_table_covers_the_cnn_and_transformer_ops():
    needed = {"conv", "max_pool", "average_pool", "global_average_pool", "batch_normalization", "relu",
              "clip", "leaky_relu", "sigmoid", "tanh", "gelu", "erf", "hard_sigmoid", "add", "sub", "mul",
              "div", "matmul", "gemm", "softmax", "log_softmax", "concat", "split", "reshape", "transpose",
              "flatten", "squeeze", "unsqueeze", "slice", "gather", "pad", "reduce_mean", "reduce_sum",
              "reduce_max", "reduce_min", "resize", "cast", "layer_normalization", "where", "expand",
              "sqrt", "pow"}
    assert needed <= SUPPORTED_OPS
    assert SUPPORTED_OPS == frozenset(KERNELS)


def test_unknown_attribute_is_a_value_error_naming_op_and_attr():
    with pytest.raises(ValueError, match=r"'conv'.*stride\b"):
        KERNELS["conv"](np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 1, 1), np.float32), stride=[2, 2])
    with pytest.raises(ValueError, match=r"'relu'.*alpha"):
        KERNELS["relu"](np.zeros(3, np.float32), alpha=0.1)


def test_register_rejects_duplicates():
    with pytest.raises(ValueError, match="twice"):
        register("add")(lambda a, b: a + b)


@pytest.mark.parametrize("call, message", [
    (lambda: KERNELS["conv"](np.zeros((1, 4, 5, 5), np.float32), np.zeros((2, 3, 3, 3), np.float32)), "group"),
    (lambda: KERNELS["conv"](np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 3, 3), np.float32)), "larger"),
    (lambda: KERNELS["max_pool"](np.zeros((1, 1, 4, 4), np.float32)), "kernel_shape"),
    (lambda: KERNELS["reshape"](np.zeros(6), np.array([4, -1])), "cannot reshape"),
    (lambda: KERNELS["add"](np.zeros(2, np.float32), np.zeros(2, np.int64)), "dtypes differ"),
    (lambda: KERNELS["gemm"](np.zeros(3), np.zeros((3, 2))), "2-D"),
    (lambda: KERNELS["split"](np.zeros(4)), "num_outputs"),
    (lambda: KERNELS["matmul"](np.zeros((2, 2)), np.zeros((2, 2)), activation="nope"), "activation"),
    (lambda: KERNELS["cast"](np.zeros(2), to=8), "not supported"),
    (lambda: KERNELS["div"](np.ones(2, np.int32), np.zeros(2, np.int32)), "division by zero"),
    (lambda: KERNELS["resize"](np.zeros((1, 1, 2, 2)), None, None, None), "scales and sizes"),
    (lambda: KERNELS["gather"](np.zeros((3, 2)), np.array([3])), "out of range"),
])
def test_bad_inputs_raise_clear_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_onnx_integer_semantics():
    a, b = np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)
    assert KERNELS["div"](a, b).tolist() == [3, -3, -3, 3]  # truncation, not floor
    assert KERNELS["mod"](a, b).tolist() == [1, 1, -1, -1]  # sign of the divisor
    assert KERNELS["mod"](a, b, fmod=1).tolist() == [1, -1, 1, -1]  # sign of the dividend
    assert KERNELS["equal"](a, b).dtype == np.bool_
    assert KERNELS["arg_max"](np.array([[1, 3, 3]]), axis=1, select_last_index=1).tolist() == [[2]]


def test_fused_relu_does_not_touch_inputs():
    x = np.array([[-1.0, 2.0]], np.float32)
    w = np.eye(2, dtype=np.float32)
    y = KERNELS["matmul"](x, w, activation="relu")
    assert y.tolist() == [[0.0, 2.0]] and x.tolist() == [[-1.0, 2.0]]
    y = KERNELS["gemm"](x, w, activation="leaky_relu", activation_attrs={"alpha": 0.5})
    assert y.tolist() == [[-0.5, 2.0]]


def test_every_op_is_documented():
    """docs/examplejson.md's op list names every kernel (and no op that does not exist)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "examplejson.md").read_text()
    ops_section = text[text.index("### Op list"):]
    table = [line for line in ops_section[:ops_section.index("Per-op notes")].splitlines() if line.startswith("|")]
    listed = set(re.findall(r"`([a-z_0-9]+)`", "\n".join(table)))
    assert SUPPORTED_OPS - listed == set(), "kernels missing from the doc's op list"
    assert listed - SUPPORTED_OPS == set(), "doc lists ops without kernels"


FLOAT_UNARY = ["exp", "log", "sqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "softplus",
               "softsign", "mish", "swish", "gelu", "elu", "selu", "celu", "leaky_relu", "hard_sigmoid",
               "hard_swish", "thresholded_relu", "relu", "abs", "neg", "floor", "ceil", "round"]


@pytest.mark.parametrize("op", FLOAT_UNARY)
def test_float16_stays_float16_and_matches_float32(op):
    x32 = np.linspace(0.05, 4.0, 101, dtype=np.float32) * (1 if op in ("log", "sqrt") else np.tile([1, -1], 51)[:101])
    x16 = x32.astype(np.float16)
    y16 = KERNELS[op](x16)
    y32 = KERNELS[op](x16.astype(np.float32))
    assert y16.dtype == np.float16 and y16.shape == x16.shape
    np.testing.assert_allclose(y16.astype(np.float32), y32, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("op, args, message", [
    ("add", (None, np.ones(2)), r"required input\(s\) \[0\] absent"),
    ("add", (np.ones(2),), "takes 2 required input"),
    ("conv", (np.ones((1, 1, 3, 3)),) * 4, "up to 3 in all, got 4"),
])
def test_input_count_and_absent_required_inputs(op, args, message):
    with pytest.raises(ValueError, match=message):
        KERNELS[op](*args)


@pytest.mark.parametrize("op, args, attrs", [
    ("arg_max", (np.arange(3.0),), {"keepdims": 0}),
    ("matmul", (np.ones(3), np.ones(3)), {"activation": "relu"}),
    ("reduce_sum", (np.ones(3),), {"keepdims": 0}),
    ("size", (np.ones((2, 3)),), {}),
])
def test_zero_d_results_are_arrays(op, args, attrs):
    y = KERNELS[op](*args, **attrs)
    assert isinstance(y, np.ndarray) and y.shape == ()


@pytest.mark.parametrize("index", [0, 2, -1, np.int32(1)], ids=str)
def test_gather_one_index_of_the_first_axis_is_a_view(index):
    """Gather of one index on axis 0 (PyTorch's attention picks q, k and v so) is a view of the input,
    equal to np.take's copy; other axes, index arrays and 1-D inputs copy as before."""
    x = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    got = KERNELS["gather"](x, np.array(index))
    np.testing.assert_array_equal(got, np.take(x, np.array(index), axis=0))
    assert np.shares_memory(got, x) and got.flags.c_contiguous
    assert not np.shares_memory(KERNELS["gather"](x, np.array(1), axis=1), x)
    assert not np.shares_memory(KERNELS["gather"](x, np.array([index])), x)
    assert KERNELS["gather"](np.arange(3.0), np.array(index)).shape == ()
    with pytest.raises(ValueError, match="out of range"):
        KERNELS["gather"](x, np.array(3))
