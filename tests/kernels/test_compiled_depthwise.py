"""The compiled depthwise convolution (``kernels/clib/compiled.py``, ``dwconv.c``, ``dwchan.c``) against
``onnx.reference`` on the numpy kernel's cases (stride 2, channel multipliers, dilation, asymmetric pads, ...)
plus the fused bias, relu, clip, hard_swish and swish, by both kernels (rows, channels side by side); and the
fallback: turned off by ``RPCSRV_COMPILED_KERNELS=0``, or no compiler on the board, the numpy kernel runs and
``status()`` says why."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from rpcsrv.executor.kernels.clib import compiled, kbuild
from rpcsrv.executor.kernels.conv import depthwise
from rpcsrv.executor.kernels.conv.conv import conv
from conftest import need_program
from test_depthwise_conv import CASES, onnx_conv

CASES_2D = [c for c in CASES if len(c[3]) == 2] + [
    (1, 16, 1, (30, 30), (3, 3), (2, 2), (1, 1), (0, 0, 1, 1)),  # TF-style SAME for stride 2: end pads only
    (1, 9, 1, (33, 35), (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),  # 5x5 stride 2, wide (the gather's vector part)
    (2, 3, 4, (16, 17), (3, 3), (2, 2), (2, 2), (1, 2, 3, 0)),  # multiplier 4, dilation, stride, asymmetric
]


@pytest.fixture(scope="module")
def generic_library(tmp_path_factory):
    """The kernels built with plain ``-O3`` (no ``-march=native``): on x86_64 that is SSE2, 4-float vectors,
    the vector width of NEON boards, where the bench machine's own build uses 8 (AVX)."""
    need_program("cc", "the compiled depthwise kernel is built with the board's C compiler")
    out = tmp_path_factory.mktemp("generic") / "libkernels-generic.so"
    subprocess.run(["cc", "-O3", *kbuild.include_flags(), "-shared", "-fPIC", "-o", str(out),
                    *map(str, compiled.SOURCES), "-lm"], check=True, capture_output=True)
    return str(out)


@pytest.fixture(params=["rows", "chan", "rows-generic", "chan-generic"])
def c_kernels(request, monkeypatch, generic_library):
    """The compiled kernel, in use (skips without a C compiler, fails under RPCSRV_REQUIRE_ALL=1), with
    its per-channel rows loops (``dwconv.c``) or the channels-side-by-side kernel (``dwchan.c``) for every
    plane it takes (smaller ones: rows); -generic: a build without ``-march=native`` (4-float vectors on
    x86_64)."""
    monkeypatch.setattr(compiled, "CHAN_MAX_PLANE", 10**9 if request.param.startswith("chan") else 0)
    need_program("cc", "the compiled depthwise kernel is built with the board's C compiler")
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    if request.param.endswith("-generic"):
        monkeypatch.setenv("RPCSRV_KERNELS_LIB", generic_library)
        request.addfinalizer(compiled.reset)  # the next test loads its own library again
    compiled.reset()
    assert compiled.status()["in_use"], compiled.status()
    if request.param.endswith("-generic"):
        assert compiled.status()["library"] == generic_library

    def numpy_path(*args, **kwargs):
        raise AssertionError("the numpy depthwise kernel ran although the compiled one was in use")

    monkeypatch.setattr("rpcsrv.executor.kernels.conv.conv.depthwise_conv", numpy_path)


def _case(case, bias, seed):
    n, c, mult, spatial, kernel, strides, dilations, pads = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c) + spatial).astype(np.float32)
    w = rng.standard_normal((c * mult, 1) + kernel).astype(np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32) if bias else None
    return x, w, b, dict(group=c, strides=list(strides), dilations=list(dilations), pads=list(pads))


@pytest.mark.parametrize("case", CASES_2D, ids=[str(i) for i in range(len(CASES_2D))])
@pytest.mark.parametrize("bias", [False, True])
def test_compiled_matches_onnx_reference(case, bias, c_kernels):
    x, w, b, attrs = _case(case, bias, CASES_2D.index(case))
    want = onnx_conv(x, w, b, **attrs)
    got = conv(x, w, b, **attrs)
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


ACTIVATIONS = {  # fused activation (name, attrs) -> what it computes
    ("relu", None): lambda y: np.maximum(y, 0),
    ("clip", (("min", 0.0), ("max", 6.0))): lambda y: np.clip(y, 0, 6),  # ReLU6
    ("clip", (("max", 0.5),)): lambda y: np.minimum(y, 0.5),
    ("hard_swish", None): lambda y: y * np.clip(y / 6 + 0.5, 0, 1),
    ("swish", None): lambda y: y / (1 + np.exp(-y)),  # SiLU: the C kernel's sigmoid over each plane
    ("sigmoid", None): lambda y: 1 / (1 + np.exp(-y)),  # not fused in C: applied after it
}


@pytest.mark.parametrize("activation", list(ACTIVATIONS), ids=lambda a: f"{a[0]}{len(a[1] or ())}")
@pytest.mark.parametrize("case", [CASES_2D[0], CASES_2D[1], CASES_2D[-1]], ids=["s1", "s2", "mult4"])
def test_compiled_fused_activations(case, activation, c_kernels):
    """relu, clip (ReLU6), hard_swish and swish run inside the C kernel; others (sigmoid) after it."""
    x, w, b, attrs = _case(case, True, 7)
    y = onnx_conv(x, w, b, **attrs) * 3  # values on both sides of clip's and hard_swish's bounds
    name, extra = activation
    want = ACTIVATIONS[activation](y)
    got = conv(x, w * 3, b * 3, activation=name, activation_attrs=dict(extra) if extra else None, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_compiled_reads_views_and_shuffles(c_kernels):
    """Non-contiguous inputs and the channel-shuffle composite (ShuffleNet) through the C kernel."""
    x, w, b, attrs = _case(CASES_2D[1], True, 3)
    view = np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    np.testing.assert_allclose(conv(view, w, b, **attrs), onnx_conv(x, w, b, **attrs), rtol=1e-5, atol=1e-5)
    n, c = x.shape[:2]
    shuffled = x.reshape(n, 2, c // 2, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)
    np.testing.assert_allclose(conv(x, w, b, input_shuffle=2, **attrs), onnx_conv(shuffled, w, b, **attrs),
                               rtol=1e-5, atol=1e-5)


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    assert compiled.status() == {"in_use": False, "reason": "turned off by RPCSRV_COMPILED_KERNELS=0",
                                 "library": None, "origin": None}
    calls = []
    real = depthwise.depthwise_conv
    monkeypatch.setattr("rpcsrv.executor.kernels.conv.conv.depthwise_conv",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    x, w, b, attrs = _case(CASES_2D[1], True, 5)
    np.testing.assert_allclose(conv(x, w, b, **attrs), onnx_conv(x, w, b, **attrs), rtol=1e-5, atol=1e-5)
    assert calls, "the numpy kernel did not run"


def test_fallback_without_a_compiler(monkeypatch, tmp_path):
    """No compiler on PATH and an empty cache: status() says so, the numpy kernel computes the conv."""
    for var in ("RPCSRV_CC", "CC", "RPCSRV_KERNELS_LIB", "RPCSRV_COMPILED_KERNELS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("RPCSRV_CACHE_DIR", str(tmp_path / "cache"))
    compiled.reset()
    try:
        state = compiled.status()
        assert not state["in_use"] and "no C compiler" in state["reason"], state
        calls = []
        real = depthwise.depthwise_conv
        monkeypatch.setattr("rpcsrv.executor.kernels.conv.conv.depthwise_conv",
                            lambda *a, **k: calls.append(1) or real(*a, **k))
        x, w, b, attrs = _case(CASES_2D[-1], True, 6)
        np.testing.assert_allclose(conv(x, w, b, activation="relu", **attrs),
                                   np.maximum(onnx_conv(x, w, b, **attrs), 0), rtol=1e-5, atol=1e-5)
        assert calls, "the numpy kernel did not run"
    finally:
        compiled.reset()  # the next test builds or finds the real library again


def test_built_once_and_cached(monkeypatch, tmp_path):
    """The library is built into the cache dir at first use and found there afterwards."""
    need_program("cc", "the compiled depthwise kernel is built with the board's C compiler")
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    monkeypatch.setenv("RPCSRV_CACHE_DIR", str(tmp_path))
    compiled.reset()
    try:
        first = compiled.status()
        assert first["in_use"] and first["library"].startswith(str(tmp_path)), first
        compiled.reset()
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no compiler now: the cached build serves
        again = compiled.status()
        assert first.pop("origin").startswith("built with ") and again.pop("origin").startswith("built for this CPU")
        assert again == first
    finally:
        compiled.reset()


def test_prebuilt_library(monkeypatch, tmp_path):
    """``RPCSRV_KERNELS_LIB``: a library built elsewhere serves a board without a compiler; a missing one is
    reported, and the numpy kernels run."""
    need_program("cc", "the prebuilt library is built here with the C compiler")
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    monkeypatch.setenv("RPCSRV_CACHE_DIR", str(tmp_path / "build"))
    compiled.reset()
    try:
        built = compiled.status()["library"]
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        monkeypatch.setenv("RPCSRV_CACHE_DIR", str(tmp_path / "empty-cache"))
        monkeypatch.setenv("RPCSRV_KERNELS_LIB", built)
        compiled.reset()
        assert compiled.status() == {"in_use": True, "library": built, "origin": "RPCSRV_KERNELS_LIB",
                                     "reason": "compiled kernels in use (depthwise convolution, sigmoid, swish, "
                                               "conv epilogue, stem convolution, max and average pooling, "
                                               "winograd transforms)"}
        monkeypatch.setenv("RPCSRV_KERNELS_LIB", str(tmp_path / "nowhere.so"))
        compiled.reset()
        state = compiled.status()
        assert not state["in_use"] and "nowhere.so does not exist" in state["reason"], state
        x, w, b, attrs = _case(CASES_2D[0], True, 8)
        np.testing.assert_allclose(conv(x, w, b, **attrs), onnx_conv(x, w, b, **attrs), rtol=1e-5, atol=1e-5)
    finally:
        compiled.reset()
