"""The im2col plan's GEMM by ``gemm.c`` (``gemm.banded``: ``rpcsrv_gemm_conv`` packing from the input, or
``rpcsrv_gemm_band`` from the bands' columns): with one BLAS thread the dense convs no fast path takes
compute their products in ``gemm.c`` (no numpy matmul called), the bias and every fused activation in its
tiles, and give ``onnx.reference``'s result for stride 2, dilation, asymmetric and SAME padding, odd sizes,
one band or many, NaN inputs; switched off (``gemm.SWITCH["im2col"]``), with 2 BLAS threads, or without the
library, the same plan runs OpenBLAS + the epilogue (same values)."""

from __future__ import annotations

import numpy as np
import pytest

import test_plans
from rpcsrv.executor import compute
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels.conv import gemm
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.conv.conv import conv
from test_compiled_depthwise import ACTIVATIONS
from test_depthwise_conv import onnx_conv
from test_plans import _close, _close_with_nans
from test_plans_im2col import CASES, _case, _planned, _want

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use
FUSED = [a for a in ACTIVATIONS if a[0] != "sigmoid"]


@pytest.fixture(autouse=True)
def one_blas_thread(monkeypatch):
    """The BLAS thread count as a job of the compute policy last set it: 1 (other tests leave 2)."""
    monkeypatch.setattr(compute.POLICY.blas, "current", 1)


def _tiled(fn):
    tiled = fn.keep[-1]
    assert tiled is not None and tiled.on()
    return tiled


TAKEN = [i for i in range(len(CASES)) if i != 5]  # (5: a 3x3 output, under gemm.MIN_COLUMNS: see below)


@pytest.mark.parametrize("case", TAKEN, ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("fused", [True, False], ids=["from-input", "from-columns"])
def test_gemm_c_bands_match_onnx_reference(case, bias, fused, c_kernels, monkeypatch):
    """Packed straight from the input (``rpcsrv_gemm_conv``: kernels of more than one tap) or from the bands'
    column matrix (strided 1x1s; any kernel with ``SWITCH["fused"]`` off)."""
    x, w, b, attrs = _case(CASES[case], bias, case)
    want = onnx_conv(x, w, b, **attrs)
    fn = _planned(x, w, b, attrs)
    _tiled(fn)
    monkeypatch.setitem(gemm.SWITCH, "fused", fused)
    monkeypatch.setattr(np, "matmul", None)  # (a call would fail: gemm.c computes)
    _close(fn(x, w, b), want)


@pytest.mark.parametrize("case", [0, 6, 7, 9], ids=["s2", "7x7map", "stem-bands", "1x1s2"])
@pytest.mark.parametrize("activation", FUSED, ids=lambda a: f"{a[0]}{len(a[1] or ())}")
def test_gemm_c_fused_activations(case, activation, c_kernels, monkeypatch):
    x, w, b, attrs = _case(CASES[case], True, 5)
    x *= 3  # both sides of clip's bounds
    want = _want(x, w, b, attrs, activation)
    fn = _planned(x, w, b, attrs, activation)
    _tiled(fn)
    monkeypatch.setattr(np, "matmul", None)
    _close(fn(x, w, b), want)


def test_gemm_c_nan_reaches_its_windows_only(c_kernels):
    x, w, b, attrs = _case(CASES[7], True, 7)  # the stem, in bands: a NaN near a band's edge
    x[0, 1, 0, 0] = np.nan
    x[0, 2, 11, 20] = np.nan
    fn = _planned(x, w, b, attrs, ("relu", None))
    _tiled(fn)
    got, want = fn(x, w, b), _want(x, w, b, attrs, ("relu", None))
    _close_with_nans(got, want)


def test_switch_off_and_two_threads_take_openblas(c_kernels, monkeypatch):
    x, w, b, attrs = _case(CASES[0], True, 9)
    want = _want(x, w, b, attrs, ("relu", None))
    fn = _planned(x, w, b, attrs, ("relu", None))
    tiled, calls, real = _tiled(fn), [], np.matmul

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "matmul", counted)
    _close(fn(x, w, b), want)
    assert not calls  # gemm.c
    monkeypatch.setitem(gemm.SWITCH, "im2col", False)
    assert not tiled.on()
    _close(fn(x, w, b), want)
    assert calls  # OpenBLAS + epilogue
    monkeypatch.setitem(gemm.SWITCH, "im2col", True)
    monkeypatch.setattr(compute.POLICY.blas, "current", 2)
    calls.clear()
    assert not tiled.on()
    _close(fn(x, w, b), want)
    assert calls
    monkeypatch.setitem(gemm.SWITCH, "on", False)  # the 1x1 convs' switch leaves these alone
    monkeypatch.setattr(compute.POLICY.blas, "current", 1)
    assert tiled.on()


def test_small_outputs_keep_openblas(c_kernels):
    """Under ``gemm.MIN_COLUMNS`` output positions: no gemm.c (``gemm.im2col_takes``), the plan as before."""
    x, w, b, attrs = _case(CASES[5], True, 3)  # 5x5 stride 3 on 9x9: 3x3 outputs
    fn = _planned(x, w, b, attrs)
    assert not gemm.im2col_takes(80, 36 * 25, 9) and fn.keep[-1] is None
    _close(fn(x, w, b), onnx_conv(x, w, b, **attrs))


def test_without_the_library_no_plan(monkeypatch):
    x, w, b, attrs = _case(CASES[0], True, 11)
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    try:
        assert compiled.library() is None
        want = onnx_conv(x, w, b, **attrs)
        assert plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], want.shape, np.float32) is None
        _close(conv(x, w, b, **attrs), want)
    finally:
        compiled.reset()
