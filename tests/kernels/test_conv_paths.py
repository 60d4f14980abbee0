"""Every conv kernel path (ungrouped GEMM, grouped batched GEMM, depthwise; flat, gathered, strided and
copy-free columns) against a direct float64 convolution on random data."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rpcsrv.executor.kernels.conv.conv import conv


def direct_conv(x, w, b, stride, pad, dilation, group):
    """Textbook 2-D convolution in float64: one multiply-add per (output, input channel, tap)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for oc, i, j in itertools.product(range(m), range(kh), range(kw)):
        g = oc // mg
        patch = xp[:, g * cg:(g + 1) * cg, i * dilation:i * dilation + stride * oh:stride,
                   j * dilation:j * dilation + stride * ow:stride]
        y[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
    return y + (0 if b is None else b.astype(np.float64)[None, :, None, None])


CASES = [  # (n, c, m, side, kernel, stride, pad, dilation, group)
    (1, 8, 16, 9, 3, 1, 1, 1, 1), (2, 8, 16, 9, 3, 2, 1, 1, 1), (1, 16, 32, 6, 3, 1, 1, 1, 1),
    (1, 12, 24, 10, 1, 1, 0, 1, 4), (2, 12, 24, 10, 1, 1, 0, 1, 3), (1, 16, 16, 9, 3, 1, 1, 1, 2),
    (1, 16, 32, 11, 3, 2, 1, 1, 4), (1, 8, 8, 12, 5, 1, 2, 1, 2), (1, 8, 8, 12, 3, 1, 2, 2, 2),
    (1, 8, 8, 10, 3, 1, 1, 1, 8), (2, 6, 12, 7, 3, 2, 1, 1, 6), (1, 3, 8, 15, 7, 2, 3, 1, 1),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_conv_matches_direct_convolution(case, activation):
    n, c, m, side, k, stride, pad, dil, group = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x = rng.standard_normal((n, c, side, side)).astype(np.float32)
    w = rng.standard_normal((m, c // group, k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    want = direct_conv(x, w, b, stride, pad, dil, group)
    if activation == "relu":
        want = np.maximum(want, 0)
    got = conv(x, w, b, strides=[stride] * 2, pads=[pad] * 4, dilations=[dil] * 2, group=group,
               activation=activation)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
