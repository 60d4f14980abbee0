"""Winograd F(2x2, 3x3) against a direct float64 convolution on random data: its float32 error stays within
a bound close to im2col's, for every channel count and geometry ``usable`` lets through, with the compiled
transforms (``winograd.c``) and with the numpy ones."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor.kernels.conv import winograd
from rpcsrv.executor.kernels.conv.conv import conv
from test_conv_paths import direct_conv

#: largest error, relative to the largest output, allowed for float32 Winograd F(2x2, 3x3)
BOUND = 2e-5


@pytest.fixture(params=["compiled", "numpy"])
def transforms(request, monkeypatch):
    """The compiled transforms (skips without a C compiler; fails under RPCSRV_REQUIRE_ALL=1), or numpy's."""
    from rpcsrv.executor.kernels.clib import compiled
    from conftest import need_program

    calls = []
    real = winograd._numpy_winograd
    monkeypatch.setattr(winograd, "_numpy_winograd", lambda *a: calls.append(1) or real(*a))
    if request.param == "compiled":
        need_program("cc", "the compiled transforms are built with the board's C compiler")
        monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
        assert compiled.status()["in_use"], compiled.status()
    else:
        monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    yield
    assert bool(calls) == (request.param == "numpy"), "the other transforms ran"


@pytest.fixture
def compiled_only(monkeypatch):
    """The compiled kernels in use (skips without a C compiler; fails under RPCSRV_REQUIRE_ALL=1)."""
    from rpcsrv.executor.kernels.clib import compiled
    from conftest import need_program

    need_program("cc", "the compiled transforms are built with the board's C compiler")
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    assert compiled.status()["in_use"], compiled.status()


@pytest.mark.parametrize("c,m,h,w,pads", [
    (48, 48, 14, 14, (1, 1, 1, 1)), (64, 64, 28, 28, (1, 1, 1, 1)), (128, 64, 15, 17, (1, 1, 1, 1)),
    (256, 48, 14, 14, (0, 0, 0, 0)), (128, 32, 56, 56, (1, 1, 1, 1)), (64, 80, 16, 13, (2, 0, 1, 1)),
    (winograd.MAX_CHANNELS, 48, 14, 14, (1, 1, 1, 1)), (192, 320, 7, 7, (1, 1, 1, 1)),
    (32, 128, 27, 27, (1, 1, 1, 1)), (128, 32, 7, 7, (1, 1, 1, 1)), (1024, 256, 7, 7, (1, 1, 1, 1)),
])
def test_winograd_error_is_bounded_against_direct_convolution(c, m, h, w, pads, transforms):
    rng = np.random.default_rng(c * m + h)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    want = direct_conv(np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3]))), wt, None, 1, 0, 1, 1)
    got = winograd.winograd_conv(x, wt, pads[:2], pads[2:])
    assert got.shape == want.shape and got.dtype == np.float32
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < BOUND, f"Winograd error {err:.2e} above {BOUND:.0e}: disable it for this geometry"
    # and no worse than a few times the im2col path's own float32 error
    winograd.ENABLED = False
    try:
        ref = conv(x, wt, pads=list(pads))
    finally:
        winograd.ENABLED = True
    assert err <= 8 * max(np.abs(ref - want).max() / np.abs(want).max(), 1e-7)


def test_conv_routes_usable_layers_through_winograd(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 64, 14, 14)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")  # the numpy transforms' rule
    assert winograd.usable(x, w, [1, 1], [1, 1], 1)
    assert not winograd.usable(x, w, [2, 2], [1, 1], 1) and not winograd.usable(x[:, :, :7, :7], w, [1, 1], [1, 1], 1)
    assert not winograd.usable(x, w[:32], [1, 1], [1, 1], 1)  # few output channels: only on large images
    assert not winograd.preferred(x, w, [1, 1], [1, 1], 1)
    # 7x7 images: with many channels and cache-sized transformed weights only
    x7, w7 = np.zeros((1, 192, 7, 7), np.float32), np.zeros((320, 192, 3, 3), np.float32)
    assert winograd.usable(x7, w7, [1, 1], [1, 1], 1) and not winograd.usable(x7, w7[:96], [1, 1], [1, 1], 1)
    assert not winograd.usable(np.zeros((1, 512, 7, 7), np.float32), np.zeros((512, 512, 3, 3), np.float32),
                               [1, 1], [1, 1], 1)
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS")
    calls = []
    real = winograd.winograd_conv
    monkeypatch.setattr(winograd, "winograd_conv", lambda *a: calls.append(1) or real(*a))
    got = conv(x, w, b, pads=[1] * 4, activation="relu")
    want = np.maximum(direct_conv(x, w, b, 1, 1, 1, 1), 0)
    assert calls and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert winograd.transformed_weights(w) is winograd.transformed_weights(w)  # transformed once


def test_compiled_transforms_take_wider_geometries_and_go_before_the_taps(compiled_only, monkeypatch):
    """With the compiled transforms, Winograd takes 32+ input and 16+ output channels on images of 7x7 and
    up (few output channels, or small weights, on small images), before the stacked taps; conv's output is
    the direct convolution's with the bias and activation."""
    from rpcsrv.executor.kernels.conv.conv import FAST_PATHS, fast_path

    def fits(c, m, h, stride=1):
        x, w = np.zeros((1, c, h, h), np.float32), np.zeros((m, c, 3, 3), np.float32)
        return winograd.preferred(x, w, [stride] * 2, [1, 1], 1) and fast_path(x, w, [stride] * 2, [1, 1], 1) \
            is FAST_PATHS[1]

    assert fits(32, 128, 27) and fits(128, 32, 28) and fits(128, 32, 7) and fits(48, 16, 14) and fits(64, 64, 7)
    assert fits(1024, 256, 7)  # many inputs, few outputs: before the taps
    assert not fits(16, 64, 55) and not fits(32, 8, 28) and not fits(32, 64, 28, stride=2) and not fits(32, 64, 5)
    assert not fits(256, 256, 7) and not fits(512, 512, 7)  # small images, large weights: im2col
    rng = np.random.default_rng(5)
    calls = []
    real = winograd.compiled_winograd
    monkeypatch.setattr(winograd, "compiled_winograd", lambda *a: calls.append(1) or real(*a))
    for c, m, h, pads in [(32, 128, 27, [1] * 4), (128, 32, 7, [1] * 4), (48, 16, 14, [0, 1, 1, 0])]:
        x = rng.standard_normal((1, c, h, h)).astype(np.float32)
        w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        b = rng.standard_normal(m).astype(np.float32)
        calls.clear()
        got = conv(x, w, b, pads=pads, activation="relu")
        xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        want = np.maximum(direct_conv(xp, w, b, 1, 0, 1, 1), 0)
        assert calls and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())
