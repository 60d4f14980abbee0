"""Kernels' derived weight data is prepared when constants are bound (``kernels.load_time``), not in the
first run: a compiled model's Winograd layers find their transformed weights cached right after
``load_module``, and the results are what the lazy path computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import helper

from rpcsrv.client import compile_onnx
from rpcsrv.executor import load_module
from rpcsrv.executor.kernels import prepared
from rpcsrv.executor.kernels.conv import winograd
from rpcsrv.executor.kernels.load_time import prepare_constants
from rpcsrv.protocol.dtypes import Device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import make_model, reference  # noqa: E402


def two_convs():
    """A Winograd-sized 3x3 conv (64 -> 64 channels, 16x16) and a strided one that is not."""
    rng = np.random.default_rng(11)
    inits = {"w1": (rng.standard_normal((64, 64, 3, 3)) / 24).astype("float32"),
             "w2": (rng.standard_normal((8, 64, 3, 3)) / 24).astype("float32")}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="wino"),
             helper.make_node("Conv", ["a", "w2"], ["out"], strides=[2, 2], name="strided")]
    return make_model(nodes, [("x", [1, 64, 16, 16])], [("out", [1, 8, 7, 7])], inits)


def cached_weights() -> set[tuple]:
    return {hit[0]().shape for hit in list(prepared._cache.values()) if hit[0]() is not None and "winograd" in hit[1]}


def test_winograd_weights_are_ready_after_load_and_results_unchanged(tmp_path):
    model = two_convs()
    path = compile_onnx(model).export_library(str(tmp_path / "m.so"))
    prepared._cache.clear()
    mod = load_module(str(path))
    assert cached_weights() == {(64, 64, 3, 3)}  # the Winograd layer's, before any run; not the strided one's
    ex = mod.get_function("default")(Device(1, 0))
    x = np.random.default_rng(2).standard_normal((1, 64, 16, 16)).astype("float32")
    ex.get_function("set_input")("x", x)
    ex.get_function("run")()
    want = reference(model, {"x": x})[0]
    np.testing.assert_allclose(ex.get_function("get_output")(0), want, rtol=1e-4, atol=1e-4)


def test_prepare_skips_computed_weights_and_other_ops():
    class N:
        def __init__(self, op, inputs, shape=(1, 64, 16, 16), dtype=np.float32):
            self.op, self.inputs, self.shape, self.dtype = op, inputs, shape, np.dtype(dtype)

    nodes = {0: N("", ()), 1: N("", (), (64, 64, 3, 3))}
    w = np.ones((64, 64, 3, 3), np.float32)
    prepared._cache.clear()
    # weights computed in the graph (not bound): nothing to prepare; a relu: no prepare function
    assert prepare_constants([N("conv", (0, 1)), N("relu", (0,))], nodes, {}, [{}, {}]) == 0
    assert prepare_constants([N("conv", (0, 1))], nodes, {1: w}, [{"pads": [1, 1, 1, 1]}]) == 1
    assert cached_weights() == {(64, 64, 3, 3)}


def test_bound_constants_are_trusted_and_a_changed_weight_is_not():
    """Constants the runtime binds cannot change (read-only), so Winograd trusts its cache by identity;
    a writeable weight (a subgraph input that ``set_input`` overwrites in place) is checked by value."""
    from rpcsrv.executor.kernels.conv.conv import conv

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 64, 16, 16)).astype("float32")
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype("float32")
    assert winograd.usable(x, w, [1, 1], [1, 1], 1)
    first = conv(x, w, pads=[1, 1, 1, 1])
    w *= 2  # in place, as set_input writes a storage buffer
    np.testing.assert_allclose(conv(x, w, pads=[1, 1, 1, 1]), 2 * first, rtol=1e-4, atol=1e-4)
    frozen = w.copy()
    frozen.flags.writeable = False
    assert prepared.immutable(frozen) and prepared.immutable(frozen[1:]) and not prepared.immutable(w)
    assert prepared.immutable(np.frombuffer(bytes(16), np.float32)) and not prepared.immutable(
        np.frombuffer(bytearray(16), np.float32))


def test_only_the_path_conv_will_take_is_prepared(monkeypatch):
    """Without the compiled kernels a few-output 3x3 conv runs as stacked taps (``taps.usable``), though
    Winograd would also take it: load time prepares the taps' weights, not Winograd's.  (With them, Winograd
    goes first: ``test_winograd.py``.)"""
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    from rpcsrv.executor.kernels.conv import taps

    class N:
        def __init__(self, op, inputs, shape, dtype=np.float32):
            self.op, self.inputs, self.shape, self.dtype = op, inputs, shape, np.dtype(dtype)

    x_shape, w = (1, 128, 56, 56), np.ones((32, 128, 3, 3), np.float32)
    assert taps.usable(np.zeros(x_shape, np.float32), w, [1, 1], [1, 1], 1)
    assert winograd.usable(np.zeros(x_shape, np.float32), w, [1, 1], [1, 1], 1)
    prepared._cache.clear()
    prepare_constants([N("conv", (0, 1), (1, 32, 56, 56))], {0: N("", (), x_shape)}, {1: w}, [{"pads": [1] * 4}])
    tags = {tag for hit in prepared._cache.values() if hit[0]() is w for tag in hit[1]}
    assert tags == {"taps"}
