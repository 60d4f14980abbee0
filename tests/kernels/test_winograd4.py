"""Winograd F(4x4, 3x3) (``winograd4.c``, planned where ``winograd.four_pays``): against ``onnx.reference``
and a direct float64 convolution: odd sizes (cropped tiles), asymmetric and SAME padding, each fused
activation, NaN inputs, its float32 error bound on the channel counts it takes; the plan picks it by size;
inputs the plan was not made for and the kernels turned off run the general kernel.  Also the products as
V^T U^T (``winograd.flip_pays``) for F(2x2) and F(4x4)."""

from __future__ import annotations

import numpy as np
import pytest

import test_plans
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.conv import winograd
from rpcsrv.executor.kernels.conv.conv import conv
from test_compiled_depthwise import ACTIVATIONS
from test_conv_paths import direct_conv
from test_depthwise_conv import onnx_conv

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use
#: F(4x4)'s larger coefficients (+-2, +-8, 1/24) round more than F(2x2)'s (``test_winograd.BOUND``: 2e-5)
BOUND = 6e-5


def _plan(x, w, b, attrs):
    fn = plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w] + ([] if b is None else [b]),
                    onnx_conv(x, w, b, **{k: v for k, v in attrs.items() if not k.startswith("activation")}).shape,
                    np.float32)
    assert fn is not None and fn.__name__ == "winograd_conv", attrs
    return fn


def _data(c, m, h, w, seed, bias=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (3 * rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    return x, wt, rng.standard_normal(m).astype(np.float32) if bias else None


@pytest.fixture
def four_everywhere(monkeypatch):
    """F(4x4) for every Winograd layer (small shapes keep the reference fast), and counts its runs."""
    monkeypatch.setattr(winograd, "FOUR_MIN_TILES", 1)
    calls = []
    real = winograd.compiled_winograd4
    monkeypatch.setattr(winograd, "compiled_winograd4", lambda *a: calls.append(1) or real(*a))
    return calls


CASES = [  # (c, m, h, w, attrs)
    (48, 40, 13, 11, {"pads": [1, 1, 1, 1]}),  # odd sizes: partial tiles cropped
    (64, 48, 9, 18, {"pads": [0, 1, 2, 0]}),  # asymmetric pads
    (48, 40, 12, 10, {"pads": [0, 0, 0, 0]}),  # no pads
    (40, 36, 11, 14, {"auto_pad": "SAME_UPPER"}),
    (40, 36, 11, 14, {"auto_pad": "SAME_LOWER"}),
    (32, 64, 16, 16, {"pads": [2, 2, 2, 2]}),  # pads larger than the kernel's reach
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("bias", [False, True])
def test_planned_winograd4_matches_onnx_reference(case, bias, c_kernels, four_everywhere):
    c, m, h, w, attrs = case
    x, wt, b = _data(c, m, h, w, c + m + h, bias)
    fn = _plan(x, wt, b, attrs)
    want = onnx_conv(x, wt, b, **attrs)
    got = fn(x, wt, b)
    assert four_everywhere and got.shape == want.shape and got.flags.c_contiguous and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=BOUND * np.abs(want).max())


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a[0] != "sigmoid"],
                         ids=lambda a: f"{a[0]}{len(a[1] or ())}")
def test_planned_winograd4_fused_activations(activation, c_kernels, four_everywhere):
    x, wt, b = _data(48, 40, 13, 11, 3)
    name, extra = activation
    attrs = {"pads": [1, 1, 1, 1], "activation": name, "activation_attrs": dict(extra) if extra else None}
    want = ACTIVATIONS[activation](onnx_conv(x, wt, b, pads=[1, 1, 1, 1]))
    got = _plan(x, wt, b, attrs)(x, wt, b)
    assert four_everywhere
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=BOUND * np.abs(want).max())


def test_planned_winograd4_nan_stays_in_its_tiles(c_kernels, four_everywhere):
    """A NaN input reaches the outputs whose windows hold it, and (through the tile transforms) at most the
    rest of its 4x4 output tiles; never other tiles."""
    x, wt, b = _data(40, 36, 16, 16, 4)
    x[0, 2, 5, 9] = np.nan
    got = _plan(x, wt, b, {"pads": [1, 1, 1, 1]})(x, wt, b)
    nan = np.isnan(got[0, 0])
    assert nan[4:7, 8:11].all()  # every output whose 3x3 window holds input (5, 9)
    tiles = np.zeros_like(nan)
    tiles[4:8, 8:12] = True  # the output tiles those fall in (the input sits in their 6x6 input tiles too)
    tiles[0:4, 8:12] = tiles[4:8, 4:8] = tiles[0:4, 4:8] = True  # neighbours whose 6x6 input tile holds it
    assert not (nan & ~tiles).any()
    clean = ~np.isnan(got)
    want = onnx_conv(np.nan_to_num(x), wt, b, pads=[1, 1, 1, 1])
    np.testing.assert_allclose(got[clean], want[clean], rtol=1e-4, atol=BOUND * np.abs(want).max())


@pytest.mark.parametrize("c,m,h,w", [(64, 64, 56, 56), (256, 256, 28, 28), (32, 128, 28, 28), (1024, 96, 30, 29)])
def test_winograd4_error_is_bounded_against_direct_convolution(c, m, h, w, c_kernels):
    rng = np.random.default_rng(c * m + h)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    want = direct_conv(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), wt, None, 1, 0, 1, 1)
    got = winograd.compiled_winograd4(x, winograd.transformed_weights4(wt), None, (1, 1), (1, 1))
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < BOUND, f"F(4x4) error {err:.2e} above {BOUND:.0e}"


def test_the_plan_picks_f4_by_size(c_kernels):
    """F(4x4) on large maps (ResNet-50's 64 -> 64 at 56x56, SqueezeNet's 16 -> 64 at 55x55), F(2x2) on small
    ones (14x14)."""
    runs = []
    for shape, four in (((1, 64, 56, 56), True), ((1, 256, 14, 14), False), ((1, 32, 27, 27), False),
                        ((1, 16, 55, 55), True)):
        assert winograd.four_pays(shape[1], 64, *shape[2:]) is four
        x = np.zeros(shape, np.float32)
        wt = np.ones((64, shape[1], 3, 3), np.float32)
        fn = plans.plan("conv", conv, {"pads": [1, 1, 1, 1]}, [(shape, x.dtype), wt], (1, 64) + shape[2:],
                        np.float32)
        assert fn is not None and fn.__name__ == "winograd_conv"
        runs.append(fn.keep[0].shape[0])  # the transformed weights: 36 or 16 planes
    assert runs == [36, 16, 16, 36]


@pytest.mark.parametrize("four", [False, True], ids=["f2", "f4"])
@pytest.mark.parametrize("flip", [False, True], ids=["UV", "VtUt"])
def test_flipped_products_match_onnx_reference(four, flip, c_kernels, monkeypatch):
    monkeypatch.setattr(winograd, "FOUR_MIN_TILES", 1 if four else 10**9)
    monkeypatch.setattr(winograd, "FOUR_MIN_TILES_WIDE", 1 if four else 10**9)
    monkeypatch.setattr(winograd, "FLIP_MAX_TILES", 10**9 if flip else 0)
    x, wt, b = _data(96, 40, 13, 11, 10)
    fn = _plan(x, wt, b, {"pads": [1, 2, 0, 1], "activation": "relu"})
    assert fn.keep[0].shape == ((36 if four else 16),) + ((96, 40) if flip else (40, 96))
    want = np.maximum(onnx_conv(x, wt, b, pads=[1, 2, 0, 1]), 0)
    np.testing.assert_allclose(fn(x, wt, b), want, rtol=1e-4, atol=BOUND * np.abs(want).max())


def test_few_input_channels_take_f4_in_the_plan_only(c_kernels, four_everywhere):
    """16-31 input channels (SqueezeNet's 16 -> 64): no Winograd fast path takes them, the plan's F(4x4) does;
    fewer (8) stay im2col."""
    x, wt, b = _data(16, 64, 13, 11, 8)
    assert not winograd.usable(x, wt, [1, 1], [1, 1], 1)
    got = _plan(x, wt, b, {"pads": [1, 1, 1, 1]})(x, wt, b)
    want = onnx_conv(x, wt, b, pads=[1, 1, 1, 1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=BOUND * np.abs(want).max())
    assert four_everywhere == [1]
    x8, w8, b8 = _data(8, 64, 13, 11, 9)
    fn = plans.plan("conv", conv, {"pads": [1, 1, 1, 1]}, [(x8.shape, x8.dtype), w8, b8], (1, 64, 13, 11),
                    np.float32)
    assert fn.__name__ == "im2col_chunks"


def test_other_inputs_and_kernels_turned_off_run_the_general_kernel(c_kernels, four_everywhere, monkeypatch):
    x, wt, b = _data(48, 40, 13, 11, 6)
    attrs = {"pads": [1, 1, 1, 1], "activation": "relu"}
    fn = _plan(x, wt, b, attrs)
    want = np.maximum(onnx_conv(x, wt, b, pads=[1, 1, 1, 1]), 0)
    tol = {"rtol": 1e-4, "atol": BOUND * np.abs(want).max()}
    wt2 = wt * 2
    np.testing.assert_allclose(fn(x, wt2, b), np.maximum(onnx_conv(x, wt2, b, pads=[1, 1, 1, 1]), 0), **tol)
    assert not four_everywhere  # other weights: the general kernel
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    assert compiled.library() is None and winograd.compiled_winograd4(x, fn.keep[0], b, (1, 1), (1, 1)) is None
    np.testing.assert_allclose(fn(x, wt, b), want, **tol)  # the kernels gone after planning: numpy's
    assert four_everywhere == [1]  # (the call above, which found no library)
    assert plans.plan("conv", conv, attrs, [(x.shape, x.dtype), wt, b], want.shape, np.float32) is None
