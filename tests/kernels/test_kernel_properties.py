"""Property tests: conv and average/max pooling against direct loop references on small random
geometries (groups, strides, dilations, asymmetric pads, ceil_mode), and elementwise broadcasting
against numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rpcsrv.executor.kernels import KERNELS


def conv_reference(x, w, b, strides, dilations, pads, group):
    """Textbook 2-D convolution: one dot product per output pixel and channel."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    oh = (h + pads[0] + pads[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for o in range(m):
        g = o // mg
        for i in range(oh):
            for j in range(ow):
                r, s = i * strides[0], j * strides[1]
                patch = xp[:, g * cg:(g + 1) * cg, r:r + (kh - 1) * dilations[0] + 1:dilations[0],
                           s:s + (kw - 1) * dilations[1] + 1:dilations[1]]
                y[:, o, i, j] = np.tensordot(patch, w[o], axes=3) + b[o]
    return y


@st.composite
def conv_setups(draw):
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    h = draw(st.integers((kh - 1) * dilations[0] + 1, 9))
    w = draw(st.integers((kw - 1) * dilations[1] + 1, 9))
    n = draw(st.integers(1, 2))
    return n, group, cg, mg, kh, kw, strides, dilations, pads, h, w


@settings(max_examples=40, deadline=None)
@given(conv_setups(), st.integers(0, 2**32 - 1))
def test_conv_matches_direct_loops(setup, seed):
    n, group, cg, mg, kh, kw, strides, dilations, pads, h, w = setup
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, group * cg, h, w))
    wt = rng.standard_normal((group * mg, cg, kh, kw))
    b = rng.standard_normal(group * mg)
    got = KERNELS["conv"](x, wt, b, strides=strides, dilations=dilations, pads=pads, group=group)
    want = conv_reference(x, wt, b, strides, dilations, pads, group)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def pool_reference(x, k, s, pads, ceil_mode, reduce, count_include_pad):
    """1-D pooling by explicit windows, with ONNX's ceil_mode rule (no window starts in end padding)."""
    n = x.shape[-1]
    span = n + pads[0] + pads[1] - k
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + pads[0]:
        out -= 1
    ys = []
    for i in range(out):
        lo = i * s - pads[0]
        cells = [x[..., p] for p in range(lo, lo + k) if 0 <= p < n]
        if reduce == "max":
            ys.append(np.max(cells, axis=0))
        else:
            padded = sum(1 for p in range(lo, lo + k) if -pads[0] <= p < n + pads[1])
            ys.append(np.sum(cells, axis=0) / (padded if count_include_pad else len(cells)))
    return np.stack(ys, axis=-1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2), st.integers(0, 1),
       st.integers(0, 1), st.sampled_from(["max", "avg"]), st.integers(0, 6))
def test_pool_matches_direct_windows(k, s, p0, p1, ceil_mode, count_include_pad, reduce, extra):
    p0, p1 = min(p0, k - 1), min(p1, k - 1)  # ONNX requires pads smaller than the kernel
    x = np.random.default_rng(extra).standard_normal((2, 3, k + extra))
    op = "max_pool" if reduce == "max" else "average_pool"
    attrs = {"kernel_shape": [k], "strides": [s], "pads": [p0, p1], "ceil_mode": ceil_mode}
    if reduce == "avg":
        attrs["count_include_pad"] = count_include_pad
    got = KERNELS[op](x, **attrs)
    want = pool_reference(x, k, s, (p0, p1), ceil_mode, reduce, count_include_pad)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@settings(max_examples=50, deadline=None)
@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
       st.sampled_from(["add", "sub", "mul", "div", "max", "min", "pow"]))
def test_broadcasting_binary_ops(shapes, op):
    rng = np.random.default_rng(0)
    a = (rng.random(shapes.input_shapes[0]) + 0.5).astype(np.float32)
    b = (rng.random(shapes.input_shapes[1]) + 0.5).astype(np.float32)
    want = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
            "max": np.maximum, "min": np.minimum, "pow": np.power}[op](a, b)
    got = KERNELS[op](a, b)
    assert got.dtype == np.float32 and got.shape == shapes.result_shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
