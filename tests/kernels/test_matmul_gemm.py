"""MatMuls by constant weights through the compiled GEMM (``kernels/conv/gemm.c``'s ``rpcsrv_matmul_f32``,
``gemm.matmul`` / ``gemm.planned_matmul``) against ``onnx.reference``: every fused activation, with and without
bias, row counts and K, N that are no multiple of the register tile or of the packing blocks, NaN where numpy
has it; the MatMul plan (2-D and batched 3-D inputs) calls it on the shapes ``gemm.takes_matmul`` and gives the
reference's values, and falls back to OpenBLAS + the epilogue (same values) when it is switched off, when more
BLAS threads run, on too few rows, and without the library."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from rpcsrv.executor import compute
from rpcsrv.executor.kernels import KERNELS, plans
from rpcsrv.executor.kernels.clib import compiled
from rpcsrv.executor.kernels.conv import gemm
from test_compiled_depthwise import ACTIVATIONS
import test_gemm
import test_plans

c_kernels = test_plans.c_kernels  # the fixture: the compiled kernels in use
one_blas_thread = test_gemm.one_blas_thread  # autouse: one BLAS thread, as the compute policy sets it
FUSED, IDS, _close = test_gemm.FUSED, test_gemm.IDS, test_gemm._close


def _reference(x, w, b=None, activation=(None, None)):
    """act(MatMul(x, w) (+ b)) by onnx.reference (the activation in float64 after it)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p" if b is not None else "y"])]
    inits = [onnx.numpy_helper.from_array(w, "w")]
    if b is not None:
        nodes.append(helper.make_node("Add", ["p", "b"], ["y"]))
        inits.append(onnx.numpy_helper.from_array(b, "b"))
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    y = ReferenceEvaluator(helper.make_model(graph)).run(None, {"x": x})[0].astype(np.float64)
    return ACTIVATIONS[activation](y) if activation[0] else y


def _data(rows, k, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = (3 * rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)  # both sides of clip's bounds
    return x, w, rng.standard_normal(n).astype(np.float32)


def _attrs(activation):
    name, extra = activation
    return dict(activation=name, activation_attrs=dict(extra) if extra else None)


@pytest.mark.parametrize("activation", FUSED, ids=IDS)
@pytest.mark.parametrize("rows,k,n", [(1, 1, 1), (3, 7, 17), (7, 49, 50), (17, 400, 101), (128, 33, 97),
                                      (130, 800, 770)], ids=lambda v: str(v))
def test_matmul_matches_onnx_reference(rows, k, n, activation, c_kernels):
    """Odd sizes: partial tiles on both sides, K over one packing block (KC), N over one column block (NC)."""
    x, w, b = _data(rows, k, n, rows * k + n)
    _close(gemm.matmul(x, w, **_attrs(activation)), _reference(x, w, activation=activation))
    _close(gemm.matmul(x, w, b, **_attrs(activation)), _reference(x, w, b, activation=activation))


@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("clip", (("min", 0.0), ("max", 6.0))),
                                        ("hard_swish", None)], ids=lambda a: str(a[0]))
def test_nan_propagates_as_numpy(activation, c_kernels):
    """A NaN input makes its output row NaN through every activation, as numpy's matmul + clip do."""
    x, w, b = _data(19, 9, 70, 3)
    x[4, 5] = x[16, 0] = np.nan
    got = gemm.matmul(x, w, b, **_attrs(activation))
    want = x @ w + b
    want = ACTIVATIONS[activation](want) if activation[0] else want
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[4]).all() and np.isnan(got[16]).all() and np.isnan(got).sum() == 2 * 70
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-4)


def _plan(ashape, n, bias, activation, seed=1):
    """(plan, x, args, want) of a MatMul of a computed ``ashape`` input by constant (K, n) weights."""
    rows = int(np.prod(ashape[:-1]))
    x2, w, b = _data(rows, ashape[-1], n, seed)
    b = b if bias else None
    name, extra = activation
    attrs = dict(**({"activation": name} if name else {}), **({"activation_attrs": dict(extra)} if extra else {}))
    want = _reference(x2, w, b, activation).reshape(ashape[:-1] + (n,))
    inputs = [(ashape, np.float32), w] + ([b] if bias else [])
    fn = plans.plan("matmul", KERNELS["matmul"], attrs, inputs, want.shape, np.float32)
    assert fn is not None and fn.__name__ == "matmul"
    return fn, x2.reshape(ashape), (w, b) if bias else (w,), want


@pytest.mark.parametrize("activation", FUSED, ids=IDS)
@pytest.mark.parametrize("ashape,n,bias", [((2, 65, 40), 52, True), ((130, 24), 49, False), ((1, 17, 384), 96, True)],
                         ids=["3d-bias", "2d-nobias", "3d-tokens"])
def test_plan_calls_the_gemm_and_falls_back(ashape, n, bias, activation, c_kernels, monkeypatch):
    """A MatMul of >= MIN_ROWS rows runs gemm.c (the plan keeps its tiled call, which computes while the
    switch is on and one BLAS thread runs); switched off, or with 2 BLAS threads, the same plan runs OpenBLAS
    + epilogue: the reference's values either way."""
    fn, x, args, want = _plan(ashape, n, bias, activation)
    tiled = fn.keep[1]
    rows = int(np.prod(ashape[:-1]))
    assert gemm.takes_matmul(rows, ashape[-1], n) and tiled is not None
    _close(tiled(x).reshape(want.shape), want)
    _close(fn(x, *args), want)
    monkeypatch.setitem(gemm.SWITCH, "on", False)
    assert tiled(x) is None
    _close(fn(x, *args), want)
    monkeypatch.setitem(gemm.SWITCH, "on", True)
    monkeypatch.setattr(compute.POLICY.blas, "current", 2)
    assert tiled(x) is None
    _close(fn(x, *args), want)


@pytest.mark.parametrize("ashape,n", [((1, 64), 32), ((1, 3, 64), 32), ((5, 384), 384)], ids=str)
def test_few_rows_keep_openblas(ashape, n, c_kernels):
    """Under MIN_ROWS rows by weights that stay in L2 (a single token, a few): OpenBLAS + epilogue, planned."""
    fn, x, args, want = _plan(ashape, n, True, ("relu", None))
    assert not gemm.takes_matmul(int(np.prod(ashape[:-1])), ashape[-1], n) and fn.keep[1] is None
    _close(fn(x, *args), want)


def test_few_rows_by_large_weights_take_the_gemm(c_kernels):
    """2 rows by 768 x 768 weights (BIG_WEIGHTS): gemm.c, the reference's values."""
    fn, x, args, want = _plan((2, 768), 768, True, (None, None))
    assert fn.keep[1] is not None
    _close(fn(x, *args), want)


def test_without_the_library_no_gemm(monkeypatch):
    """Compiled kernels off: gemm.matmul says so (None), the MatMul gets no plan and its kernel (numpy) runs."""
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    try:
        x, w, b = _data(40, 30, 20, 0)
        assert gemm.matmul(x, w, b) is None
        assert plans.plan("matmul", KERNELS["matmul"], {}, [(x.shape, x.dtype), w, b], (40, 20), np.float32) is None
        _close(np.ascontiguousarray(KERNELS["matmul"](x, w, b), np.float32), _reference(x, w, b))
    finally:
        compiled.reset()


@pytest.mark.parametrize("activation", [(None, None), ("relu", None), ("swish", None)], ids=lambda a: str(a[0]))
@pytest.mark.parametrize("trans_b,bias_shape", [(1, (1, 36)), (0, (36,)), (1, None)], ids=["transB-c2d", "c1d",
                                                                                           "transB-noc"])
def test_gemm_of_many_rows_takes_it(trans_b, bias_shape, activation, c_kernels, monkeypatch):
    """A Gemm of many rows by constant weights (PyTorch's attention output projection) plans gemm.c's MatMul:
    onnx.reference's Gemm values, and the table kernel's with 2 BLAS threads or a non-contiguous input."""
    rng = np.random.default_rng(trans_b)
    a = rng.standard_normal((33, 40)).astype(np.float32)
    w = rng.standard_normal((36, 40) if trans_b else (40, 36)).astype(np.float32)
    c = None if bias_shape is None else rng.standard_normal(bias_shape).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "w"] + ([] if c is None else ["c"]), ["y"], transB=trans_b)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w")] +
                              ([] if c is None else [onnx.numpy_helper.from_array(c, "c")]))
    want = ReferenceEvaluator(helper.make_model(graph)).run(None, {"a": a})[0].astype(np.float64)
    want = ACTIVATIONS[activation](want) if activation[0] else want
    attrs = {"transB": trans_b, **({"activation": activation[0]} if activation[0] else {})}
    fn = plans.plan("gemm", KERNELS["gemm"], attrs, [(a.shape, a.dtype), w] + ([] if c is None else [c]), (33, 36),
                    np.float32)
    assert fn is not None and fn.keep[-1] is not None
    args = (w,) if c is None else (w, c)
    _close(fn(a, *args), want)
    np.testing.assert_allclose(fn(np.asfortranarray(a), *args), want, rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(compute.POLICY.blas, "current", 2)
    assert fn.keep[-1](a) is None
    np.testing.assert_allclose(fn(a, *args), want, rtol=1e-5, atol=1e-4)


def test_encoder_runs_its_linear_layers_on_the_gemm(c_kernels, monkeypatch, tmp_path):
    """The zoo's transformer encoder (bench/bench_models.build_encoder: Q/K/V, output and feed-forward
    MatMuls with bias and Relu), compiled and loaded as the board does: its MatMuls by constants call gemm.c
    (counted) and its output matches onnxruntime's; switched off, or with 2 BLAS threads, OpenBLAS runs them,
    the same values."""
    import importlib.util

    from rpcsrv.client import compile_onnx
    from rpcsrv.executor import load_module
    from rpcsrv.protocol.dtypes import Device
    from conftest import need_module

    ort = need_module("onnxruntime")
    spec = importlib.util.spec_from_file_location(
        "bench_models", Path(__file__).resolve().parents[2] / "bench" / "bench_models.py")
    bench_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_models)
    calls = []  # per call of a planned MatMul: whether gemm.c computed it
    one_thread = gemm._one_thread

    def counted():
        inner = one_thread()

        def check():
            calls.append(inner())
            return calls[-1]
        return check

    monkeypatch.setattr(gemm, "_one_thread", counted)
    model = bench_models.build_encoder(seq=24, width=64, heads=4, ffn=160, layers=2)
    lib = tmp_path / "encoder.blob"
    compile_onnx(model).export_library(str(lib), fmt="blob")
    x = np.random.default_rng(0).standard_normal((1, 24, 64)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None,
                                                                                                   {"tokens": x})[0]
    ex = load_module(str(lib)).get_function("default")(Device(1, 0))
    ex.get_function("set_input")("tokens", x)
    for on, threads in ((True, 1), (False, 1), (True, 2)):  # 2 BLAS threads: OpenBLAS's turn
        monkeypatch.setitem(gemm.SWITCH, "on", on)
        calls.clear()
        with compute.fixed_threads(threads):
            ex.get_function("run")()
        got = ex.get_function("get_output")(0)
        assert calls == [on and threads == 1] * 12  # 2 layers x (Q, K, V, output, 2 feed-forward)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
