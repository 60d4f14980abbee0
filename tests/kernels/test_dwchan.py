"""The channels-side-by-side depthwise kernel and pools (``dwchan.c``) and the pools by rows (``pools.c``).

The depthwise kernel on MobileNet/EfficientNet-style layers (14x14 and 7x7 maps, stride 2, 5x5, SAME and
asymmetric pads, channel multipliers, dilation, channel counts no multiple of the vector width, every fused
activation) against ``onnx.reference``; on random geometries against dwconv.c's rows kernel; NaN inputs;
which kernel a plan calls (small maps and negative-free pads only: the rows kernel otherwise).  The max and
average pools (channels side by side, by rows or on phase planes, as dwconv.c's rpcsrv_pool_block picks
by shape: each taken here) on random geometries (widths below and above the vector width, strides 1-3,
dilation, pads, ceil mode, count_include_pad) against the numpy table kernel, and NaN placements for the
max (exactly); both with the library built for this CPU and without ``-march=native``.
"""

from __future__ import annotations

import numpy as np
import pytest

import test_compiled_depthwise
import test_plans
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels.conv import depthwise
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.pool import pool
from rpcsrv.executor.kernels.conv.conv import conv
from test_compiled_depthwise import ACTIVATIONS
from test_depthwise_conv import onnx_conv

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use
generic_library = test_compiled_depthwise.generic_library  # the fixture: a build without -march=native

LAYERS = [  # (c, mult, (h, w), kernel, strides, dilations, pads or auto_pad)
    (20, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 20 channels: 2 blocks of 8 and a partial one
    (13, 1, (14, 14), (3, 3), (2, 2), (1, 1), (0, 0, 1, 1)),  # stride 2, TF-style SAME pads (end only)
    (9, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 7x7: rows shorter than a vector
    (17, 1, (14, 14), (5, 5), (2, 2), (1, 1), "SAME_UPPER"),  # MobileNetV3's 5x5 stride 2
    (11, 1, (7, 7), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (6, 2, (9, 10), (3, 3), (1, 1), (2, 2), (2, 1, 0, 3)),  # multiplier 2, dilation, asymmetric pads
    (5, 3, (12, 11), (3, 3), (2, 1), (1, 1), (1, 0, 1, 2)),  # multiplier 3, a stride on one axis
    (3, 1, (4, 4), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 16 inputs, 16 outputs: runs overlap
    (10, 1, (3, 3), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),  # 9 inputs (one more than a vector)
    (12, 1, (16, 16), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 16 wide, 3x3 stride 1: runs within rows
    (10, 1, (9, 50), (3, 3), (1, 1), (1, 1), (1, 0, 1, 2)),  # 50 wide: each row's last run overlaps
    (5, 2, (10, 16), (3, 3), (2, 1), (2, 1), (2, 1, 2, 1)),  # the same with a stride and dilation in H
]


def _layer(case, seed):
    c, mult, spatial, kernel, strides, dilations, pads = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c) + spatial).astype(np.float32)
    w = rng.standard_normal((c * mult, 1) + kernel).astype(np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32)
    attrs = dict(group=c, strides=list(strides), dilations=list(dilations), kernel_shape=list(kernel))
    attrs.update(auto_pad=pads) if isinstance(pads, str) else attrs.update(pads=list(pads))
    return x, w, b, attrs


@pytest.fixture(params=["native", "generic"])
def both_builds(request, c_kernels, monkeypatch, generic_library):
    """The library built for this CPU, or without ``-march=native`` (4-float vectors on x86_64)."""
    if request.param == "generic":
        monkeypatch.setenv("RPCSRV_KERNELS_LIB", generic_library)
        compiled.reset()
        request.addfinalizer(compiled.reset)
        assert compiled.status()["library"] == generic_library
    return compiled.library()


@pytest.fixture
def spy(both_builds, monkeypatch):
    """Which parameter-block kernel each planned conv calls: ``calls`` lists "chan" or "rows" (either build)."""
    lib, calls = both_builds, []
    for name in ("chan", "rows"):
        real = getattr(lib, f"rpcsrv_{name}_block")
        monkeypatch.setattr(lib, f"rpcsrv_{name}_block", lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    return calls


FUSED = [a for a in ACTIVATIONS if a[0] != "sigmoid"] + [(None, None)]  # sigmoid: not fused, not planned


@pytest.mark.parametrize("case", LAYERS, ids=[str(i) for i in range(len(LAYERS))])
@pytest.mark.parametrize("activation", FUSED, ids=lambda a: f"{a[0]}{len(a[1] or ())}")
def test_planned_chan_matches_onnx_reference(case, activation, spy):
    x, w, b, attrs = _layer(case, LAYERS.index(case))
    w, b = w * 3, b * 3  # values on both sides of clip's and hard_swish's bounds
    want = onnx_conv(x, w, b, **attrs)
    name, extra = activation
    want = ACTIVATIONS[activation](want) if name else want
    attrs.update(activation=name, activation_attrs=dict(extra) if extra else None)
    fn = plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], want.shape, np.float32)
    assert fn is not None and fn.__name__ == "rows"
    got = fn(x, w, b)
    assert spy == ["chan"], "the planned depthwise conv did not run the channels-side-by-side kernel"
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_small_maps_run_the_rows_kernel(spy, monkeypatch):
    """Fewer than 8 outputs (or inputs) per plane, or the chan kernel turned off: the rows kernel."""
    x, w, b, attrs = _layer((16, 1, (3, 3), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)), 0)  # 2x2 outputs
    fn = plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], (1, 16, 2, 2), np.float32)
    np.testing.assert_allclose(fn(x, w, b), onnx_conv(x, w, b, **attrs), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(compiled, "CHAN_MAX_PLANE", 0)
    x, w, b, attrs = _layer(LAYERS[0], 0)
    fn = plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], (1, 20, 14, 14), np.float32)
    np.testing.assert_allclose(fn(x, w, b), onnx_conv(x, w, b, **attrs), rtol=1e-5, atol=1e-4)
    assert spy == ["rows", "rows"]


def test_chan_reads_the_channel_shuffle(spy):
    """ShuffleNet's input shuffle, read in place by the chan kernel as by the rows kernel."""
    x, w, b, attrs = _layer((24, 1, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)), 4)
    shuffled = x.reshape(1, 3, 8, 14, 14).swapaxes(1, 2).reshape(x.shape)
    fn = plans.plan("conv", conv, dict(attrs, input_shuffle=3), [(x.shape, x.dtype), w, b], (1, 24, 14, 14),
                    np.float32)
    np.testing.assert_allclose(fn(x, w, b), onnx_conv(shuffled, w, b, **attrs), rtol=1e-5, atol=1e-4)
    assert spy == ["chan"]


def _both(x, w, b, strides, dilations, begin, out, monkeypatch, activation=None, attrs=None):
    """(chan, rows): the compiled depthwise conv by each kernel."""
    got = []
    for limit in (10**9, 0):
        monkeypatch.setattr(compiled, "CHAN_MAX_PLANE", limit)
        got.append(compiled.depthwise_conv2d(x, w, b, strides, dilations, begin, out, activation, attrs))
    return got


def test_chan_equals_rows_on_random_geometries(c_kernels, monkeypatch):
    rng = np.random.default_rng(27)
    taken = 0
    for _ in range(150):
        c, mult = int(rng.integers(1, 20)), int(rng.integers(1, 4))
        h, wd = (int(v) for v in rng.integers(2, 24, 2))
        kernel = tuple(int(v) for v in rng.integers(1, 6, 2))
        strides = tuple(int(v) for v in rng.integers(1, 4, 2))
        dilations = tuple(int(v) for v in rng.integers(1, 3, 2))
        begin = tuple(int(v) for v in rng.integers(0, 3, 2))
        end = tuple(int(v) for v in rng.integers(0, 3, 2))
        out = tuple((n + p0 + p1 - d * (k - 1) - 1) // s + 1 for n, p0, p1, d, k, s in zip(
            (h, wd), begin, end, dilations, kernel, strides))
        if min(out) < 1:
            continue
        monkeypatch.setattr(compiled, "CHAN_MAX_PLANE", 10**9)
        taken += compiled.takes_chan(h, wd, kernel, strides, dilations, begin, out)
        x = rng.standard_normal((int(rng.integers(1, 3)), c, h, wd)).astype(np.float32)
        w = rng.standard_normal((c * mult, 1) + kernel).astype(np.float32)
        b = rng.standard_normal(c * mult).astype(np.float32)
        chan, rows = _both(x, w, b, strides, dilations, begin, out, monkeypatch)
        np.testing.assert_allclose(chan, rows, rtol=1e-5, atol=1e-5, err_msg=str((x.shape, w.shape, strides,
                                                                                   dilations, begin, end)))
    assert taken > 60, taken


@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("clip", (("min", 0.0), ("max", 6.0))),
                                        ("hard_swish", None)], ids=lambda a: str(a[0]))
def test_chan_propagates_nan(activation, c_kernels, monkeypatch):
    """A NaN input makes NaN every output whose window holds it, through the fused activation too."""
    x, w, b, _ = _layer(LAYERS[0], 9)
    x[0, 3, 5, 6] = x[0, 17, 0, 0] = x[0, 19, 13, 13] = np.nan
    name, extra = activation
    chan, rows = _both(x, w, b, (1, 1), (1, 1), (1, 1), (14, 14), monkeypatch, name, dict(extra) if extra else None)
    want = np.isnan(depthwise.depthwise_conv(x, w, b, (1, 1), (1, 1), (1, 1), (1, 1), (14, 14), 1))
    assert want.sum() == 9 + 4 + 4  # an inner input is in 9 windows, a corner one in 4
    np.testing.assert_array_equal(np.isnan(chan), want)
    np.testing.assert_array_equal(chan, rows)


def _pool_cases():
    rng = np.random.default_rng(5)
    cases = [((1, 64, 111, 111), dict(kernel_shape=[3, 3], strides=[2, 2])),  # SqueezeNet's
             ((1, 8, 56, 56), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1)),
             ((2, 3, 5, 6), dict(kernel_shape=[2, 3], strides=[1, 1], pads=[1, 1, 1, 1])),  # rows under a vector
             ((1, 2, 7, 30), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 2, 1, 2])),  # stride 3: scalar
             ((1, 3, 20, 33), dict(kernel_shape=[3, 2], strides=[2, 2], dilations=[2, 3], pads=[2, 1, 0, 2]))]
    for _ in range(40):
        k = [int(v) for v in rng.integers(1, 4, 2)]
        s = [int(v) for v in rng.integers(1, 4, 2)]
        d = [int(v) for v in rng.integers(1, 3, 2)]
        p = [int(rng.integers(0, kk)) for kk in k] * 2
        hw = [int(v) for v in rng.integers(4, 40, 2)]
        if min(n + 2 * pp - dd * (kk - 1) - 1 for n, pp, dd, kk in zip(hw, p, d, k)) < 0:
            continue
        cases.append(((1, int(rng.integers(1, 5)), *hw), dict(kernel_shape=k, strides=s, dilations=d, pads=p,
                                                              ceil_mode=int(rng.integers(0, 2)))))
    return cases


def test_average_pool_matches_the_table_kernel(both_builds):
    rng = np.random.default_rng(4)
    for shape, attrs in _pool_cases():
        attrs = dict(attrs, count_include_pad=int(rng.integers(0, 2)))
        x = rng.standard_normal(shape).astype(np.float32)
        want = pool.average_pool(x, **attrs)
        fn = plans.plan("average_pool", pool.average_pool, attrs, [(x.shape, x.dtype)], want.shape, np.float32)
        if fn is None:
            continue
        np.testing.assert_allclose(fn(x), want, rtol=1e-5, atol=1e-6, err_msg=str((shape, attrs)))


def test_max_pool_matches_the_table_kernel(both_builds):
    rng = np.random.default_rng(3)
    for shape, attrs in _pool_cases():
        x = rng.standard_normal(shape).astype(np.float32)
        want = pool.max_pool(x, **attrs)
        fn = plans.plan("max_pool", pool.max_pool, attrs, [(x.shape, x.dtype)], want.shape, np.float32)
        if fn is None:  # a pad at least the window (ceil mode's last window): the table kernel's
            continue
        np.testing.assert_array_equal(fn(x), want, err_msg=str((shape, attrs)))
        for at in (0, -1, x.size // 3, shape[-1] - 1):  # NaN wins, at the edges and in the vector tails
            x.reshape(-1)[at] = np.nan
        np.testing.assert_array_equal(fn(x), pool.max_pool(x, **attrs), err_msg=str((shape, attrs)))
