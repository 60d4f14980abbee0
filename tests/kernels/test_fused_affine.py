"""Kernels with a fused activation: batch_normalization (the compiler's batch_norm_relu composite) gives
the same values as BatchNormalization then Relu in float64, in every rank and float dtype, NaN kept, the
input untouched; add and sum (add_relu, sum_relu) likewise."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor.kernels import KERNELS

RNG = np.random.default_rng(3)


def reference(x, scale, b, mean, var, epsilon):
    k = x.ndim - 2
    ch = [np.asarray(v, np.float64).reshape((-1,) + (1,) * k) for v in (scale, b, mean, var)]
    return (x.astype(np.float64) - ch[2]) / np.sqrt(ch[3] + epsilon) * ch[0] + ch[1]


def params(c, dtype):
    return [(1 + 0.3 * RNG.standard_normal(c)).astype(dtype), (0.2 * RNG.standard_normal(c)).astype(dtype),
            (0.5 * RNG.standard_normal(c)).astype(dtype), (0.5 + RNG.random(c)).astype(dtype)]


@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-5), ("float64", 1e-12), ("float16", 2e-3)])
@pytest.mark.parametrize("shape", [(2, 5), (1, 7, 9), (2, 6, 5, 4), (1, 3, 2, 3, 4)])
def test_batch_norm_relu_matches_reference(dtype, rtol, shape):
    x = RNG.standard_normal(shape).astype(dtype)
    before = x.copy()
    p = params(shape[1], dtype)
    bn = KERNELS["batch_normalization"]
    want = reference(x, *p, 1e-3)
    got = bn(x, *p, epsilon=1e-3)
    fused = bn(x, *p, epsilon=1e-3, activation="relu")
    assert got.dtype == fused.dtype == x.dtype and got.shape == fused.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(fused, np.maximum(want, 0), rtol=rtol, atol=rtol)
    assert (fused >= 0).all() and (fused[want < -rtol] == 0).all()
    np.testing.assert_array_equal(x, before)  # the input is not written


def test_nan_stays_nan_and_other_activations_apply():
    x = RNG.standard_normal((1, 4, 3, 3)).astype("float32")
    x[0, 1, 2, 2] = np.nan
    p = params(4, "float32")
    bn = KERNELS["batch_normalization"]
    y = bn(x, *p, activation="relu")
    assert np.isnan(y[0, 1, 2, 2]) and np.isnan(y).sum() == 1
    sig = bn(x, *p, activation="sigmoid")
    np.testing.assert_allclose(sig, 1 / (1 + np.exp(-bn(x, *p).astype(np.float64))), rtol=1e-6)
    with pytest.raises(ValueError, match="activation"):
        bn(x, *p, activation="no_such_op")


def test_unit_statistics_compute_scale_and_shift_exactly():
    """The compiler's folded form (mean 0, var 1, epsilon 0) is exactly x * scale + B."""
    x = RNG.standard_normal((1, 5, 4, 4)).astype("float32")
    s, b = RNG.standard_normal(5).astype("float32"), RNG.standard_normal(5).astype("float32")
    y = KERNELS["batch_normalization"](x, s, b, np.zeros(5, "float32"), np.ones(5, "float32"), epsilon=0.0)
    want = x * s.reshape(-1, 1, 1)
    want += b.reshape(-1, 1, 1)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("shapes", [[(2, 3, 4), (2, 3, 4)], [(2, 3, 4), (3, 1)], [(), ()], [(1, 4)],
                                    [(4,), (2, 1), (1,)]])
def test_add_and_sum_with_relu_leave_their_inputs_alone(shapes):
    """The Add/Sum+Relu composites (residual connections): relu of the sum, on a buffer of their own
    even when the sum is one input or a broadcast of it."""
    xs = [RNG.standard_normal(s).astype("float32") for s in shapes]
    before = [x.copy() for x in xs]
    want = np.maximum(sum(x.astype(np.float64) for x in xs), 0)
    got = KERNELS["sum"](*xs, activation="relu")
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == np.float32 and got.shape == np.broadcast_shapes(*shapes)
    if len(xs) == 2:
        added = KERNELS["add"](*xs, activation="relu")
        np.testing.assert_allclose(added, want, rtol=1e-6)
        assert np.asarray(KERNELS["add"](*xs)).shape == want.shape
    for x, b in zip(xs, before):
        np.testing.assert_array_equal(x, b)
