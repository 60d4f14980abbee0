"""Stacked-taps convolution (``kernels/conv/taps.py``): one GEMM over all kernel taps, then shifted adds.
Checked against a direct float64 convolution on random data for every geometry it accepts (asymmetric
pads, non-square kernels, batch, bias and fused relu through ``conv``), and routed only where it was
measured to win (few outputs per input channel)."""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.executor.kernels.conv import taps
from rpcsrv.executor.kernels.conv.conv import conv
from test_conv_paths import direct_conv


def reference(x, w, b, pads):
    """Direct conv of x with asymmetric ``pads`` (top, left, bottom, right), in float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    y = direct_conv(xp, w, None, 1, 0, 1, 1)
    return y if b is None else y + b.reshape(-1, 1, 1)


@pytest.mark.parametrize("n,c,m,h,w,k,pads", [
    (1, 128, 32, 7, 7, (3, 3), (1, 1, 1, 1)), (1, 64, 16, 13, 9, (3, 3), (0, 0, 0, 0)),
    (2, 32, 8, 10, 12, (3, 3), (2, 0, 1, 1)), (1, 40, 12, 9, 11, (5, 5), (2, 2, 2, 2)),
    (1, 24, 6, 8, 8, (1, 3), (0, 1, 0, 1)), (1, 24, 6, 8, 8, (3, 1), (1, 0, 1, 0)),
    (1, 16, 8, 6, 5, (2, 2), (0, 0, 1, 1)),
])
def test_taps_conv_matches_a_direct_convolution(n, c, m, h, w, k, pads):
    rng = np.random.default_rng(c * m + h)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((m, c) + k) / np.sqrt(c * k[0] * k[1])).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    got = taps.taps_conv(x, wt, pads[:2], pads[2:])
    want = reference(x, wt, None, pads)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    # through conv (routed here when usable): bias, fused relu, and a non-contiguous input
    if taps.usable(x, wt, [1, 1], [1, 1], 1):
        xs = np.ascontiguousarray(np.concatenate([x, x], axis=3))[:, :, :, ::2]
        y = conv(xs, wt, b, pads=list(pads), activation="relu")
        np.testing.assert_allclose(y, np.maximum(reference(xs, wt, b, pads), 0), rtol=1e-4, atol=2e-5)


def test_routed_only_where_few_outputs_per_input_channel():
    x = np.zeros((1, 128, 28, 28), np.float32)
    assert taps.usable(x, np.zeros((32, 128, 3, 3), np.float32), [1, 1], [1, 1], 1)  # DenseNet's 3x3
    assert not taps.usable(x, np.zeros((128, 128, 3, 3), np.float32), [1, 1], [1, 1], 1)  # im2col/Winograd
    assert not taps.usable(x, np.zeros((32, 128, 1, 1), np.float32), [1, 1], [1, 1], 1)  # 1x1: no taps
    assert not taps.usable(x, np.zeros((32, 128, 3, 3), np.float32), [2, 2], [1, 1], 1)  # strided
    assert not taps.usable(x, np.zeros((32, 64, 3, 3), np.float32), [1, 1], [1, 1], 2)  # grouped
    assert not taps.usable(x.astype(np.float64), np.zeros((32, 128, 3, 3)), [1, 1], [1, 1], 1)
    assert not taps.usable(np.zeros((1, 128, 6, 6), np.float32), np.zeros((32, 128, 3, 3), np.float32),
                           [1, 1], [1, 1], 1)  # too few positions


def test_stacked_weights_follow_a_changed_weight():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 10, 10)).astype(np.float32)
    w = rng.standard_normal((16, 64, 3, 3)).astype(np.float32)
    first = conv(x, w, pads=[1, 1, 1, 1])
    w *= -1  # in place: a weight that is a subgraph input
    np.testing.assert_allclose(conv(x, w, pads=[1, 1, 1, 1]), -first, rtol=1e-5, atol=1e-5)
