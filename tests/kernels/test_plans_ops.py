"""Run plans of the ops around the convolutions (``kernels/pool/plans_pool.py``,
``kernels/elementwise/plans_elementwise.py``, ``kernels/plans_reduce.py``, ``plans_shape.py``,
``plans_linalg.py``) against ``onnx.reference`` or float64: max and average pools on test_pool_paths' cases,
Add/Sum with an activation, GlobalAveragePool, ReduceMean, Sigmoid, Gelu, HardSigmoid, Softmax, views (Flatten,
Reshape), a classifier's Gemm and MatMul by constant weights; inputs a plan was not made for run the table
kernel."""

from __future__ import annotations

import numpy as np
import pytest

import test_plans
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.pool import pool
from test_compiled_depthwise import ACTIVATIONS
from test_plans import _close
from test_pool_paths import CASES as POOL_CASES, ids as pool_ids, reference as pool_reference

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use

POOLS_2D = [c for c in POOL_CASES if len(c[0]) == 4]


@pytest.mark.parametrize("case", POOLS_2D, ids=[pool_ids(c) for c in POOLS_2D])
def test_planned_max_pool_matches_onnx_reference(case, c_kernels):
    """The pool cases of test_pool_paths (strides, asymmetric and SAME pads, dilation, ceil_mode, batches),
    by the compiled phase-plane kernel; NaN wins, as in numpy's maximum."""
    shape, attrs = case
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = pool_reference("MaxPool", x, **attrs).astype(np.float32)
    fn = plans.plan("max_pool", pool.max_pool, attrs, [(x.shape, x.dtype)], want.shape, np.float32)
    assert fn is not None and fn.__name__ == "max_pool"
    got = fn(x)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    x.reshape(-1)[x.size // 2] = np.nan
    np.testing.assert_array_equal(fn(x), pool.max_pool(x, **attrs))


def test_max_pool_unplanned(c_kernels):
    """The indices output, other dtypes and ranks stay the table kernel's."""
    x = np.zeros((1, 2, 8, 8), np.float32)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    assert plans.plan("max_pool", pool.max_pool, dict(attrs, return_indices=1), [(x.shape, x.dtype)],
                      (1, 2, 4, 4), np.float32) is None
    assert plans.plan("max_pool", pool.max_pool, attrs, [(x.shape, np.float64)], (1, 2, 4, 4), np.float64) is None
    assert plans.plan("max_pool", pool.max_pool, dict(kernel_shape=[2], strides=[2]), [((1, 2, 8), x.dtype)],
                      (1, 2, 4), np.float32) is None
    fn = plans.plan("max_pool", pool.max_pool, attrs, [(x.shape, x.dtype)], (1, 2, 4, 4), np.float32)
    other = np.arange(2 * 2 * 6 * 6, dtype=np.float32).reshape(2, 2, 6, 6)  # another shape: the table kernel
    np.testing.assert_array_equal(fn(other), pool.max_pool(other, **attrs))


ADD_ACTIVATIONS = [(None, None), ("relu", None), ("clip", (("min", 0.0), ("max", 6.0))), ("hard_swish", None),
                   ("swish", None)]


@pytest.mark.parametrize("op", ["add", "sum"])
@pytest.mark.parametrize("form", ["channel", "channel-first", "channel-4d", "residual"])
@pytest.mark.parametrize("activation", ADD_ACTIVATIONS, ids=lambda a: str(a[0]))
def test_planned_add(op, form, activation, c_kernels):
    """A per-channel constant (batch norm's shift, either operand, (C, 1, 1) or (1, C, 1, 1)) or a residual
    tensor, added with the fused activation in one pass; two images; other operands: the table kernel."""
    from rpcsrv.executor.kernels import KERNELS

    rng = np.random.default_rng(len(form))
    x = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    other = rng.standard_normal(x.shape if form == "residual" else (1, 6, 1, 1) if form == "channel-4d"
                                else (6, 1, 1)).astype(np.float32) * 3
    name, extra = activation
    attrs = {**({"activation": name} if name else {}), **({"activation_attrs": dict(extra)} if extra else {})}
    args = [other, x] if form == "channel-first" else [x, other]
    want = x.astype(np.float64) + other
    want = ACTIVATIONS[activation](want) if name else want
    specs = [a if a is other and form != "residual" else (a.shape, a.dtype) for a in args]
    fn = plans.plan(op, KERNELS[op], attrs, specs, x.shape, np.float32)
    assert fn is not None and fn.__name__ in ("channel_add", "residual")
    _close(fn(*args), want)
    if form != "residual":  # another constant: the table kernel
        swapped = [a * 2 if a is other else a for a in args]
        _close(fn(*swapped), KERNELS[op](*swapped, **attrs))


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize("case", POOLS_2D, ids=[pool_ids(c) for c in POOLS_2D])
def test_planned_average_pool_matches_onnx_reference(case, include, c_kernels):
    """test_pool_paths' 2-D cases with and without count_include_pad (ceil_mode overhang never counts)."""
    shape, attrs = case
    attrs = dict(attrs, count_include_pad=include)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    want = pool_reference("AveragePool", x, **attrs)
    fn = plans.plan("average_pool", pool.average_pool, attrs, [(x.shape, x.dtype)], want.shape, np.float32)
    assert fn is not None and fn.__name__ == "average_pool"
    _close(fn(x), want)


@pytest.mark.parametrize("shape", [(1, 1280, 7, 7), (2, 3, 5, 1), (1, 4, 1, 1), (1, 8, 16, 16), (1, 5, 3, 7)],
                         ids=lambda s: "x".join(map(str, s)))
def test_planned_global_average_pool(shape, c_kernels):
    """Row means (vector and scalar tails: 1, 15, 21, 49, 256 values) against onnx.reference."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from rpcsrv.executor.kernels import KERNELS

    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32) + 3
    node = helper.make_node("GlobalAveragePool", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, None)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    want = ReferenceEvaluator(helper.make_model(graph)).run(None, {"x": x.astype(np.float64)})[0]
    fn = plans.plan("global_average_pool", KERNELS["global_average_pool"], {}, [(x.shape, x.dtype)], want.shape,
                    np.float32)
    assert fn is not None and fn.__name__ == "global_average_pool"
    _close(fn(x), want)
    _close(fn(np.asfortranarray(x)), want)  # not C-contiguous: the table kernel


@pytest.mark.parametrize("shape", [(1, 96, 1, 1), (2, 3, 5), (1, 17)], ids=lambda s: "x".join(map(str, s)))
def test_planned_sigmoid(shape, c_kernels):
    from rpcsrv.executor.kernels import KERNELS

    x = (np.random.default_rng(5).standard_normal(shape) * 8).astype(np.float32)
    fn = plans.plan("sigmoid", KERNELS["sigmoid"], {}, [(x.shape, x.dtype)], x.shape, np.float32)
    assert fn is not None and fn.__name__ == "sigmoid"
    want = 1 / (1 + np.exp(-x.astype(np.float64)))
    _close(fn(x), want)
    assert plans.plan("sigmoid", KERNELS["sigmoid"], {}, [(x.shape, np.float64)], x.shape, np.float64) is None



@pytest.mark.parametrize("attrs", [{}, {"alpha": 1 / 6, "beta": 0.5}], ids=["default", "hard_swish-gate"])
def test_planned_hard_sigmoid(attrs, c_kernels):
    """MobileNetV3's gates: clip(alpha * x + beta, 0, 1), NaN kept; float64 not planned."""
    from rpcsrv.executor.kernels import KERNELS

    x = (np.random.default_rng(6).standard_normal((1, 72, 1, 1)) * 8).astype(np.float32)
    x[0, 3] = np.nan
    fn = plans.plan("hard_sigmoid", KERNELS["hard_sigmoid"], attrs, [(x.shape, x.dtype)], x.shape, np.float32)
    assert fn is not None and fn.__name__ == "hard_sigmoid"
    want = np.clip(attrs.get("alpha", 0.2) * x.astype(np.float64) + attrs.get("beta", 0.5), 0, 1)
    got = fn(x)
    assert np.isnan(got[0, 3]) and np.isnan(want[0, 3])
    _close(np.nan_to_num(got), np.nan_to_num(want))
    assert plans.plan("hard_sigmoid", KERNELS["hard_sigmoid"], attrs, [(x.shape, np.float64)], x.shape,
                      np.float64) is None


def test_planned_views(c_kernels):
    """Flatten and Reshape to a constant shape give a view of the declared shape; another input shape or
    another shape constant runs the table kernel."""
    from rpcsrv.executor.kernels import KERNELS

    x = np.arange(24, dtype=np.float32).reshape(1, 6, 2, 2)
    fn = plans.plan("flatten", KERNELS["flatten"], {"axis": 1}, [(x.shape, x.dtype)], (1, 24), np.float32)
    assert fn.__name__ == "view" and np.shares_memory(fn(x), x)
    np.testing.assert_array_equal(fn(x), KERNELS["flatten"](x, axis=1))
    other = np.zeros((2, 3, 2, 2), np.float32)
    assert fn(other).shape == (2, 12)
    dims = np.array([1, 6, 4], np.int64)
    fn = plans.plan("reshape", KERNELS["reshape"], {}, [(x.shape, x.dtype), dims], (1, 6, 4), np.float32)
    np.testing.assert_array_equal(fn(x, dims), x.reshape(1, 6, 4))
    np.testing.assert_array_equal(fn(x, np.array([6, 4], np.int64)), x.reshape(6, 4))
    assert plans.plan("reshape", KERNELS["reshape"], {}, [(x.shape, x.dtype), ((3,), np.int64)], (1, 6, 4),
                      np.float32) is None  # a computed shape


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("activation", [(None, None), ("hard_swish", None), ("relu", None)], ids=lambda a: str(a[0]))
def test_planned_gemm(trans_b, activation, c_kernels):
    """A classifier's Gemm of one row (MobileNetV3's hard_swish head), bias and activation in one pass;
    other weights, or two rows, run the table kernel."""
    from rpcsrv.executor.kernels import KERNELS

    rng = np.random.default_rng(trans_b)
    a = rng.standard_normal((1, 40)).astype(np.float32)
    w = rng.standard_normal((24, 40) if trans_b else (40, 24)).astype(np.float32)
    c = rng.standard_normal(24).astype(np.float32)
    name, _ = activation
    attrs = {"transB": trans_b, **({"activation": name} if name else {})}
    want = a.astype(np.float64) @ (w.T if trans_b else w) + c
    want = ACTIVATIONS[activation](want) if name else want
    fn = plans.plan("gemm", KERNELS["gemm"], attrs, [(a.shape, a.dtype), w, c], (1, 24), np.float32)
    assert fn is not None and fn.__name__ == "gemm"
    _close(fn(a, w, c), want)
    _close(fn(a, w * 2, c), KERNELS["gemm"](a, w * 2, c, **attrs))
    assert plans.plan("gemm", KERNELS["gemm"], attrs, [((2, 40), a.dtype), w, c], (2, 24), np.float32) is None


def _onnx_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("shape", [(1, 4, 128, 128), (1, 1000), (2, 3, 5), (3, 17), (4, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_planned_softmax(shape, c_kernels, monkeypatch):
    from rpcsrv.executor.kernels import KERNELS

    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 6).astype(np.float32)
    x.reshape(-1, shape[-1])[0] += 500  # a large row: the max is taken out before exp
    if shape[-1] > 2:
        x.reshape(-1, shape[-1])[-1, ::2] = -1e30  # masked scores: their share is 0
    for axis in (-1, len(shape) - 1):
        fn = plans.plan("softmax", KERNELS["softmax"], {"axis": axis}, [(x.shape, x.dtype)], x.shape, np.float32)
        assert fn is not None and fn.__name__ == "softmax"
        want = _onnx_softmax(x, axis)
        np.testing.assert_allclose(fn(x), want, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(fn(np.asfortranarray(x)), want, rtol=2e-6, atol=1e-7)  # the table kernel
    if len(shape) > 1 and shape[0] > 1:  # another axis: the table kernel's
        assert plans.plan("softmax", KERNELS["softmax"], {"axis": 0}, [(x.shape, x.dtype)], x.shape,
                          np.float32) is None
    assert plans.plan("softmax", KERNELS["softmax"], {}, [(x.shape, np.float64)], x.shape, np.float64) is None
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")  # the numpy fallback: no plan, the table kernel
    assert plans.plan("softmax", KERNELS["softmax"], {}, [(x.shape, x.dtype)], x.shape, np.float32) is None
    np.testing.assert_allclose(KERNELS["softmax"](x, axis=-1), _onnx_softmax(x, -1), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("activation", [(None, None)] + [a for a in ACTIVATIONS if a[0] != "sigmoid"],
                         ids=lambda a: f"{a[0]}{len(a[1] or ())}")
@pytest.mark.parametrize("ashape,n,bias", [((2, 5, 8), 12, True), ((1, 7, 33), 19, False), ((6, 16), 40, True)],
                         ids=["3d-bias", "odd-nobias", "2d-bias"])
def test_planned_matmul(ashape, n, bias, activation, c_kernels, monkeypatch):
    """MatMul by constant weights with the compiler's bias and fused activation, against float64; inputs the
    plan was not made for, and the numpy fallback, run the table kernel."""
    from rpcsrv.executor.kernels import KERNELS

    rng = np.random.default_rng(len(ashape) * n)
    a = (rng.standard_normal(ashape) * 2).astype(np.float32)
    w = rng.standard_normal((ashape[-1], n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32) if bias else None
    name, extra = activation
    attrs = {"activation": name, "activation_attrs": dict(extra) if extra else None} if name else {}
    want = a.astype(np.float64) @ w + (0 if c is None else c)
    want = ACTIVATIONS[activation](want) if name else want
    shape = ashape[:-1] + (n,)
    inputs = [(ashape, np.float32), w] + ([c] if bias else [])
    fn = plans.plan("matmul", KERNELS["matmul"], attrs, inputs, shape, np.float32)
    assert fn is not None and fn.__name__ == "matmul"
    args = (w, c) if bias else (w,)
    _close(fn(a, *args), want)
    _close(fn(np.asfortranarray(a), *args), want)  # not C-contiguous: the table kernel
    w2 = w * 2  # other weights: the table kernel
    want2 = a.astype(np.float64) @ w2 + (0 if c is None else c)
    _close(fn(a, w2, *args[1:]), ACTIVATIONS[activation](want2) if name else want2)
    assert plans.plan("matmul", KERNELS["matmul"], attrs, [(ashape, np.float32), w[None]] + inputs[2:],
                      shape, np.float32) is None  # batched weights
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")  # the numpy fallback: no plan
    assert plans.plan("matmul", KERNELS["matmul"], attrs, inputs, shape, np.float32) is None


@pytest.mark.parametrize("shape,axes,keepdims,as_input", [
    ((1, 1024, 7, 7), [2, 3], 0, False), ((1, 1024, 7, 7), [-1, -2], 1, True), ((2, 3, 5), [2], 0, True),
    ((1, 17), [1], 1, False), ((1, 8, 4, 4), [1, 2, 3], 0, False)], ids=lambda v: str(v))
def test_planned_reduce_mean_over_trailing_axes(shape, axes, keepdims, as_input, c_kernels):
    """ReduceMean over trailing axes (attribute, opset 13, or constant input, opset 18) against
    onnx.reference; other axes and non-contiguous inputs run the table kernel."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from rpcsrv.executor.kernels import KERNELS

    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) + 2
    opset = 18 if as_input else 13
    node = helper.make_node("ReduceMean", ["x", "axes"] if as_input else ["x"], ["y"], keepdims=keepdims,
                            **({} if as_input else {"axes": axes}))
    inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if as_input else []
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, None)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    want = ReferenceEvaluator(model).run(None, {"x": x.astype(np.float64)})[0]
    const = np.array(axes, np.int64)
    attrs = {"keepdims": keepdims} if as_input else {"axes": axes, "keepdims": keepdims}
    inputs = [(x.shape, x.dtype)] + ([const] if as_input else [])
    fn = plans.plan("reduce_mean", KERNELS["reduce_mean"], attrs, inputs, want.shape, np.float32)
    assert fn is not None and fn.__name__ == "reduce_mean"
    args = [const] if as_input else []
    _close(fn(x, *args), want)
    np.testing.assert_allclose(fn(np.asfortranarray(x), *args), want, rtol=1e-5)  # the table kernel
    if as_input:  # another axes array than the planned constant: the table kernel, which reads it
        other = np.array([len(shape) - 1], np.int64)
        np.testing.assert_allclose(fn(x, other), np.mean(x, axis=-1, keepdims=bool(keepdims)), rtol=1e-6)


def test_reduce_mean_unplanned(c_kernels):
    """Leading or middle axes, all axes by default, and float64 stay the table kernel's."""
    from rpcsrv.executor.kernels import KERNELS

    k = KERNELS["reduce_mean"]
    spec = [((1, 4, 5, 6), np.float32)]
    assert plans.plan("reduce_mean", k, {"axes": [1, 2]}, spec, (1, 1, 1, 6), np.float32) is None
    assert plans.plan("reduce_mean", k, {}, spec, (1, 1, 1, 1), np.float32) is None
    assert plans.plan("reduce_mean", k, {"axes": [3]}, [((1, 4, 5, 6), np.float64)], (1, 4, 5, 1),
                      np.float64) is None


@pytest.mark.parametrize("shape", [(1, 128, 1024), (3, 5), (17,)], ids=lambda s: "x".join(map(str, s)))
def test_planned_gelu_matches_onnx_reference(shape, c_kernels):
    """The compiled one-pass Gelu (vector body and scalar tail) against onnx.reference's Gelu in float64;
    NaN and infinities as the table kernel gives them."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from rpcsrv.executor.kernels import KERNELS
    x = (np.random.default_rng(6).standard_normal(shape) * 4).astype(np.float32)
    node = helper.make_node("Gelu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, None)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    want = ReferenceEvaluator(model).run(None, {"x": x.astype(np.float64)})[0]
    fn = plans.plan("gelu", KERNELS["gelu"], {}, [(x.shape, x.dtype)], x.shape, np.float32)
    assert fn is not None and fn.__name__ == "gelu"
    got = fn(x)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=3e-7)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -9.0, 9.0] * 3, np.float32)[:x.size]
    y = np.resize(special, x.shape).astype(np.float32)
    with np.errstate(invalid="ignore"):  # -inf * 0: NaN, as the table kernel gives it
        np.testing.assert_array_equal(fn(y), KERNELS["gelu"](y))
    assert plans.plan("gelu", KERNELS["gelu"], {"approximate": "tanh"}, [(x.shape, x.dtype)], x.shape,
                      np.float32) is None
