"""The im2col plan (``plans_conv.im2col_plan`` with ``im2col.c``): dense convs no fast path takes (strided 1x1s
too), with weights past ``CHUNK_MAX_WEIGHTS`` (one band: ResNet-50's and Inception's stride-2 3x3s, 3x3s on
7x7 maps) or small ones (bands of output rows), give ``onnx.reference``'s result for stride 2, dilation,
asymmetric and SAME padding, odd sizes, each fused activation, NaN inputs; inputs the plan was not made for
and the kernels turned off run the general kernel; no plan without the compiled kernels."""

from __future__ import annotations

import numpy as np
import pytest

import test_plans
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.conv.conv import conv
from test_compiled_depthwise import ACTIVATIONS
from test_depthwise_conv import onnx_conv
from test_plans import _close, _close_with_nans

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use

CASES = [  # (c, m, spatial, kernel, attrs): m * c * kh * kw > CHUNK_MAX_WEIGHTS unless said
    (40, 130, (15, 13), (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # stride 2, odd sizes
    (48, 100, (14, 14), (3, 3), {"strides": [2, 2], "pads": [0, 1, 2, 0]}),  # asymmetric pads
    (48, 100, (13, 12), (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    (48, 100, (13, 12), (3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    (40, 120, (11, 12), (3, 3), {"strides": [1, 2], "dilations": [2, 1], "pads": [2, 1, 2, 1]}),  # dilation
    (36, 80, (9, 9), (5, 5), {"strides": [3, 3], "pads": [2, 2, 2, 2]}),  # stride 3, 5x5
    (384, 300, (7, 7), (3, 3), {"pads": [1, 1, 1, 1]}),  # a 3x3 on a 7x7 map that Winograd leaves (many weights)
    (3, 16, (23, 21), (7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # small weights: a stem, in bands
    (40, 120, (7, 6), (3, 3), {"strides": [2, 2], "pads": [4, 5, 3, 6]}),  # pads wider than the kernel
    (256, 200, (13, 11), (1, 1), {"strides": [2, 2]}),  # ResNet's strided 1x1 shortcut, odd sizes
    (24, 40, (15, 16), (1, 1), {"strides": [2, 3]}),  # small weights, in bands
]


def _want(x, w, b, attrs, activation):
    y = onnx_conv(x, w, b, **attrs)
    return ACTIVATIONS[activation](y) if activation[0] else y


def _planned(x, w, b, attrs, activation=(None, None)):
    name, extra = activation
    full = dict(attrs, **({"activation": name, "activation_attrs": dict(extra) if extra else None} if name else {}))
    inputs = [(x.shape, x.dtype), w] + ([] if b is None else [b])
    fn = plans.plan("conv", conv, full, inputs, onnx_conv(x, w, b, **attrs).shape, np.float32)
    assert fn is not None and fn.__name__ == "im2col_chunks", attrs
    return fn


def _case(case, bias, seed):
    c, m, spatial, kernel, attrs = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c) + spatial).astype(np.float32)
    w = (rng.standard_normal((m, c) + kernel) / np.sqrt(c * kernel[0] * kernel[1])).astype(np.float32)
    return x, w, rng.standard_normal(m).astype(np.float32) if bias else None, attrs


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("bias", [False, True])
def test_planned_im2col_matches_onnx_reference(case, bias, c_kernels):
    x, w, b, attrs = _case(case, bias, CASES.index(case))
    fn = _planned(x, w, b, attrs)
    _close(fn(x, w, b), onnx_conv(x, w, b, **attrs))


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a[0] != "sigmoid"],
                         ids=lambda a: f"{a[0]}{len(a[1] or ())}")
def test_planned_im2col_fused_activations(activation, c_kernels):
    x, w, b, attrs = _case(CASES[0], True, 5)
    fn = _planned(x, w, b, attrs, activation)
    _close(fn(x, w, b), _want(x, w, b, attrs, activation))


def test_planned_im2col_nan_and_padding_zeros(c_kernels):
    """A NaN reaches exactly the outputs whose windows hold it (the padding reads zeros, not stale data)."""
    x, w, b, attrs = _case(CASES[0], True, 7)
    x[0, 3, 0, 0] = np.nan
    x[0, 5, 14, 12] = np.nan
    fn = _planned(x, w, b, attrs, ("relu", None))
    got, want = fn(x, w, b), _want(x, w, b, attrs, ("relu", None))
    _close_with_nans(got, want)


def test_other_inputs_and_kernels_turned_off_run_the_general_kernel(c_kernels, monkeypatch):
    x, w, b, attrs = _case(CASES[1], True, 9)
    fn = _planned(x, w, b, attrs)
    want = onnx_conv(x, w, b, **attrs)
    _close(fn(np.asfortranarray(x), w, b), want)  # not C-contiguous
    w2 = w * 2
    _close(fn(x, w2, b), onnx_conv(x, w2, b, **attrs))  # other weights
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    assert compiled.library() is None
    _close(fn(x, w, b), want)  # the kernels gone after planning: the numpy table kernel
    assert plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], want.shape, np.float32) is None
