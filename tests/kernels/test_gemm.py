"""The compiled 1x1-conv GEMM (``kernels/conv/gemm.c``, ``gemm.py``) against ``onnx.reference``: every fused
activation, with and without bias, a residual, a squeeze-and-excitation scale, sizes that are no multiple of
the register tile or of the packing blocks, NaN where numpy has it; the pointwise plans (plain, residual,
scaled) call it on the shapes ``gemm.takes`` and give the reference's result, and fall back to OpenBLAS + the
epilogue (same values) when it is switched off, when more BLAS threads run, and without the library."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from rpcsrv.executor import compute
from rpcsrv.executor.kernels.clib import compiled, kbuild
from rpcsrv.executor.kernels.conv import gemm
from rpcsrv.executor.kernels import plans
from rpcsrv.executor.kernels.conv.conv import conv
from conftest import need_program
from test_compiled_depthwise import ACTIVATIONS
from test_depthwise_conv import onnx_conv
import test_plans

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use

FUSED = [a for a in ACTIVATIONS if a[0] != "sigmoid"] + [(None, None)]


@pytest.fixture(autouse=True)
def one_blas_thread(monkeypatch):
    """The BLAS thread count as a job of the compute policy last set it: 1 (other tests leave 2)."""
    monkeypatch.setattr(compute.POLICY.blas, "current", 1)
IDS = [f"{a[0]}{len(a[1] or ())}" for a in FUSED]


def _reference(x, w, b=None, r=None, s=None, activation=(None, None)):
    """act(conv(s * x, w, b) + r) by onnx.reference, (M, Q) from x (K, Q) and w (M, K)."""
    k, q = x.shape
    xs = x if s is None else x * s.reshape(k, 1)
    y = onnx_conv(xs.reshape(1, k, 1, q), w.reshape(*w.shape, 1, 1), b)[0].reshape(-1, q)
    y = y if r is None else y + r
    return ACTIVATIONS[activation](y) if activation[0] else y


def _close(got, want):
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5 * max(1.0, np.abs(want).max()))


def _data(m, k, q, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((k, q)).astype(np.float32)
    w = (3 * rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)  # both sides of clip's bounds
    return x, w, rng.standard_normal(m).astype(np.float32), rng.standard_normal((m, q)).astype(np.float32), \
        rng.uniform(0, 1, k).astype(np.float32)


@pytest.mark.parametrize("activation", FUSED, ids=IDS)
@pytest.mark.parametrize("m,k,q", [(1, 1, 1), (3, 7, 17), (17, 49, 33), (9, 3, 1031), (40, 400, 50),
                                   (7, 800, 770)], ids=lambda v: str(v))
def test_gemm_matches_onnx_reference(m, k, q, activation, c_kernels):
    """Odd sizes: partial tiles on both sides, k over one packing block (KC), q over one (NC)."""
    x, w, b, r, s = _data(m, k, q, m * k + q)
    name, extra = activation
    attrs = dict(activation=name, activation_attrs=dict(extra) if extra else None)
    _close(gemm.gemm(x, w, **attrs), _reference(x, w, activation=activation))
    _close(gemm.gemm(x, w, b, **attrs), _reference(x, w, b, activation=activation))
    _close(gemm.gemm(x, w, b, r, **attrs), _reference(x, w, b, r, activation=activation))
    _close(gemm.gemm(x, w, None, r, s, **attrs), _reference(x, w, None, r, s, activation=activation))


@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("clip", (("min", 0.0), ("max", 6.0))),
                                        ("hard_swish", None)], ids=lambda a: str(a[0]))
def test_nan_propagates_as_numpy(activation, c_kernels):
    """A NaN input makes its output columns NaN through every activation, as numpy's matmul + clip do."""
    m, k, q = 13, 9, 70
    x, w, b, _, _ = _data(m, k, q, 3)
    x[4, 5] = x[0, 64] = np.nan
    name, extra = activation
    got = gemm.gemm(x, w, b, activation=name, activation_attrs=dict(extra) if extra else None)
    want = w @ x + b.reshape(m, 1)
    want = ACTIVATIONS[activation](want) if name else want
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[:, 5]).all() and np.isnan(got[:, 64]).all() and np.isnan(got).sum() == 2 * m
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-4)


def _planned(kind, m, k, hw, activation, seed=1):
    """(plan, args, want) of a 1x1 conv of kind pointwise / residual / scaled, from the planner."""
    from rpcsrv.executor.examplejson.scale_fold import scaled

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, k) + hw).astype(np.float32)
    w = (3 * rng.standard_normal((m, k, 1, 1)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    r = rng.standard_normal((1, m) + hw).astype(np.float32)
    s = rng.uniform(0, 1, (1, k, 1, 1)).astype(np.float32)
    name, extra = activation
    attrs = dict(**({"activation": name} if name else {}), **({"activation_attrs": dict(extra)} if extra else {}))
    want = onnx_conv(x * s if kind == "scaled" else x, w, b) + (r if kind == "residual" else 0)
    want = ACTIVATIONS[activation](want) if name else want
    if kind == "pointwise":
        fn = plans.plan("conv", conv, attrs, [(x.shape, x.dtype), w, b], want.shape, np.float32)
        args = (x, w, b)
    elif kind == "residual":
        fn = plans.plan("residual_conv", conv, attrs, [(x.shape, x.dtype), w, b, (r.shape, r.dtype)], want.shape,
                        np.float32)
        args = (x, w, b, r)
    else:
        kernel = scaled(conv)
        fn = plans.plan(kernel.plan_as, kernel, attrs, [(x.shape, x.dtype), (s.shape, s.dtype), w, b], want.shape,
                        np.float32)
        args = (x, s, w, b)
    assert fn is not None and fn.__name__ == ("scaled_pointwise" if kind == "scaled" else
                                              "residual_pointwise" if kind == "residual" else "pointwise")
    return fn, args, want


@pytest.mark.parametrize("activation", FUSED, ids=IDS)
@pytest.mark.parametrize("kind", ["pointwise", "residual", "scaled"])
def test_plans_call_the_gemm_and_fall_back(kind, activation, c_kernels, monkeypatch):
    """A 1x1 conv over >= MIN_COLUMNS positions runs gemm.c (the plan keeps its tiled call, which computes
    while the switch is on and one BLAS thread runs); switched off, or with 2 BLAS threads, the same plan
    runs OpenBLAS + epilogue: the reference's values either way."""
    fn, args, want = _planned(kind, 24, 20, (23, 25), activation)  # 575 positions: gemm.c
    tiled = fn.keep[-1]
    x, r = args[0], args[3] if kind == "residual" else None
    s = args[1] if kind == "scaled" else None
    assert gemm.takes(24, 20, 575) and tiled is not None
    _close(tiled(x, s, r).reshape(want.shape), want)
    _close(fn(*args), want)
    monkeypatch.setitem(gemm.SWITCH, "on", False)
    assert tiled(x, s, r) is None
    _close(fn(*args), want)
    monkeypatch.setitem(gemm.SWITCH, "on", True)
    monkeypatch.setattr(compute.POLICY.blas, "current", 2)
    assert tiled(x, s, r) is None
    _close(fn(*args), want)


def test_small_maps_keep_openblas(c_kernels):
    """Maps under MIN_COLUMNS positions (squeeze-and-excitation's 1x1): OpenBLAS + epilogue, planned."""
    fn, args, want = _planned("pointwise", 16, 8, (3, 3), (None, None))
    assert not gemm.takes(16, 8, 9) and fn.keep[-1] is None
    _close(fn(*args), want)


def test_without_the_library_no_gemm(monkeypatch):
    """Compiled kernels off: gemm.gemm says so (None), the 1x1 conv gets no plan and its kernel (numpy) runs."""
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    try:
        x, w, b, _, _ = _data(4, 3, 600, 0)
        assert gemm.gemm(x, w, b) is None
        x4, w4 = x.reshape(1, 3, 20, 30), w.reshape(4, 3, 1, 1)
        assert plans.plan("conv", conv, {}, [(x4.shape, x4.dtype), w4, b], (1, 4, 20, 30), np.float32) is None
        _close(conv(x4, w4, b)[0].reshape(4, 600), _reference(x, w, b))
    finally:
        compiled.reset()



@pytest.mark.parametrize("target,flags,runner,mr", [
    ("aarch64-linux-gnu", [], "qemu-aarch64-static", 8),  # 32 NEON registers: 8 x 12 tiles
    ("arm-linux-gnueabihf", ["-mfpu=neon"], "qemu-arm-static", 6),  # armv7 NEON: 6 x 8
    ("arm-linux-gnueabihf", [], "qemu-arm-static", 6)])  # no NEON: the vectors lowered to scalars
def test_cross_builds_warning_free_and_correct(target, flags, runner, mr, tmp_path):
    """gemm.c for the boards' targets: no warning with -Wall -Wextra, and its results against a naive loop
    (tests/kernels/gemm_check.c) under qemu-user."""
    cc = need_program(f"{target}-gcc", "the cross compiler (apt-get install gcc-" + target.replace("_", "-") + ")")
    qemu = need_program(runner, "qemu-user-static runs the cross-built check")
    exe = tmp_path / "check"
    build = subprocess.run([cc, "-O3", *flags, "-static", "-Wall", "-Wextra", "-Werror", *kbuild.include_flags(),
                            "-o", str(exe), str(Path(__file__).with_name("gemm_check.c")), str(kbuild.source("gemm.c")),
                            str(kbuild.source("sigmoid.c")), str(kbuild.source("im2col.c")),  # (gemm.c's conv packing)
                            "-lm"], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([qemu, str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["ok", str(mr)], run.stdout + run.stderr
