"""Branches written straight into their Concat's buffer (rpcsrv.executor.examplejson.concat_fold): Fire- and
Inception-style blocks built with onnx.helper, compiled by compile_onnx and run by the executor, against
onnxruntime and against the same module with the fold off; the producers' values are views of the Concat's
buffer exactly where the fold applies, and the block is left alone where it must be (a producer with another
reader, a producer that is a graph output, two images).  Also: two threads calling one subgraph function at
once."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from conftest import need_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import make_model, reference, run_compiled  # noqa: E402

RNG = np.random.default_rng(11)
PLANS: set = set()  # (kernel name, takes out=) of every folded producer seen


def _w(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype("float32")


def _act(kind: str, src: str, dst: str) -> list:
    if kind == "relu":
        return [helper.make_node("Relu", [src], [dst])]
    if kind == "relu6":
        return [helper.make_node("Clip", [src, "lo", "hi"], [dst])]
    if kind == "leaky":
        return [helper.make_node("LeakyRelu", [src], [dst], alpha=0.1)]
    if kind == "sigmoid":
        return [helper.make_node("Sigmoid", [src], [dst])]
    return [helper.make_node("Identity", [src], [dst])]


def block_model(c=8, side=13, n=1, acts=("relu", "relu", "relu6", "leaky", "sigmoid"), axis=1,
                shared=False, graph_output=False, s=16, m3=20):
    """x (n, c, side, side) -> squeeze 1x1 + relu -> branches: 1x1, 3x3 (pad 1), maxpool 3x3 -> 1x1, 5x5 (pad 2),
    depthwise 3x3, each with its activation, and an average pool of the squeeze -> Concat along ``axis``.
    ``shared``: the 1x1 branch is also read by an Add that is a second output; ``graph_output``: the 3x3 branch
    is also a graph output.  ``axis`` 2: every branch has one channel and they are stacked along the rows.
    ``s``: the squeeze's channels, ``m3`` the 3x3's (Winograd takes 32 -> 20 at 13x13, F(4x4) 64 -> 64 at 28)."""
    m = 1 if axis in (2, -2) else None
    inits = {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32), "ws": _w(s, c, 1, 1),
             "bs": _w(s, 1).reshape(s)}
    outs = [m or 12, m or m3, m or 6, m or 10, m or s]
    inits.update({"w1": _w(outs[0], s, 1, 1), "b1": _w(outs[0], 1).reshape(-1), "w3": _w(outs[1], s, 3, 3),
                  "b3": _w(outs[1], 1).reshape(-1), "wp": _w(outs[2], s, 1, 1), "w5": _w(outs[3], s, 5, 5),
                  "b5": _w(outs[3], 1).reshape(-1), "wd": _w(s, 1, 3, 3), "bd": _w(s, 1).reshape(-1)})
    nodes = [helper.make_node("Conv", ["x", "ws", "bs"], ["sq0"]), helper.make_node("Relu", ["sq0"], ["sq"]),
             helper.make_node("Conv", ["sq", "w1", "b1"], ["e1c"]),
             helper.make_node("Conv", ["sq", "w3", "b3"], ["e3c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["sq"], ["mp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["mp", "wp"], ["epc"]),
             helper.make_node("Conv", ["sq", "w5", "b5"], ["e5c"], pads=[2, 2, 2, 2]),
             helper.make_node("Conv", ["sq", "wd", "bd"], ["edc"], pads=[1, 1, 1, 1], group=s),
             helper.make_node("AveragePool", ["sq"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    for kind, (src, dst) in zip(acts, [("e1c", "e1"), ("e3c", "e3"), ("epc", "ep"), ("e5c", "e5"), ("edc", "ed")]):
        nodes += _act(kind, src, dst)
    # along the rows: the one-channel branches (the depthwise conv and the pool keep the squeeze's channels)
    branches = ["e1", "e3", "ep", "e5"] if axis in (2, -2) else ["e1", "e3", "ep", "e5", "ed", "ap"]
    nodes.append(helper.make_node("Concat", branches, ["out"], axis=axis))
    widths = outs[:5] + [s]
    cat_shape = [n, sum(widths), side, side] if axis in (1, -3) else [n, 1, side * len(branches), side]
    outputs = [("out", cat_shape)]
    if shared:
        nodes.append(helper.make_node("Add", ["e1", "e1"], ["twice"]))
        outputs.append(("twice", [n, outs[0], side, side]))
    if graph_output:
        outputs.append(("e3", [n, outs[1], side, side]))
    return make_model(nodes, [("x", [n, c, side, side])], outputs, inits), len(branches)


def _subgraph_functions(path):
    from rpcsrv.executor import load_module
    from rpcsrv.protocol.dtypes import Device

    gmod = load_module(path).get_function("default")(Device(1, 0))
    return [f for f in gmod._functions.values() if hasattr(f, "steps")]


def _run_both(model, tmp_path):
    """(fold on, fold off) outputs of the compiled model, onnxruntime's, and the Concat's views seen by the hook.
    Also checks each folded producer's kernel: ``Into.wrap``'s around a plan or the table kernel."""
    from rpcsrv.client import compile_onnx
    from rpcsrv.executor import compute
    from rpcsrv.executor.examplejson import concat_fold
    from rpcsrv.executor.module import STEP_HOOK

    need_module("onnxruntime")
    x = RNG.standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
    feed = {"x": x.astype("float32")}
    compiled = compile_onnx(model)
    path = compiled.export_library(str(tmp_path / "plans.blob"))
    for fn in _subgraph_functions(path):
        for node, kernel, *_ in fn.steps:
            assert (node.id in fn._into) == hasattr(kernel, "inner")
            if node.id in fn._into:
                PLANS.add((kernel.inner.__name__, getattr(kernel.inner, "into", False)))
    seen = {}
    # one BLAS thread for both, as the policy may pick otherwise per run: gemm.c's and OpenBLAS's products
    # differ in the last bit, and the two runs are compared bit for bit
    with compute.fixed_threads(1):
        token = STEP_HOOK.set(lambda g, node, value, s: seen.__setitem__(node.id, (node.op, value)))
        try:
            on = run_compiled(compiled, feed, tmp_path, "on.blob")
        finally:
            STEP_HOOK.reset(token)
        concat_fold.SWITCH["on"] = False
        try:
            off = run_compiled(compiled, feed, tmp_path, "off.blob")
        finally:
            concat_fold.SWITCH["on"] = True
    return on, off, reference(model, feed), seen


def _views_of_the_concat(seen) -> int:
    """How many steps' values are views of a Concat's result (the producers written in place)."""
    cats = [v for op, v in seen.values() if op == "concat"]
    return sum(1 for op, v in seen.values() if op != "concat" and any(v.base is c for c in cats))


@pytest.mark.parametrize("acts", [("relu",) * 5, ("relu6", "leaky", "sigmoid", "none", "relu")])
@pytest.mark.parametrize("axis", [1, -3])
def test_fire_and_inception_blocks_write_into_the_concat(tmp_path, acts, axis):
    model, branches = block_model(acts=acts, axis=axis)
    on, off, want, seen = _run_both(model, tmp_path)
    np.testing.assert_allclose(on[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(on[0], off[0])
    assert _views_of_the_concat(seen) == branches


@pytest.mark.parametrize("s,m3,side,plan", [(32, 20, 13, "winograd_conv"), (64, 64, 28, "winograd_conv")])
def test_winograd_writes_into_the_concat(tmp_path, s, m3, side, plan):
    PLANS.clear()
    model, branches = block_model(s=s, m3=m3, side=side)
    on, off, want, seen = _run_both(model, tmp_path)
    np.testing.assert_allclose(on[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(on[0], off[0])
    assert _views_of_the_concat(seen) == branches
    assert {(plan, True), ("pointwise", True), ("average_pool", True)} <= PLANS


def test_along_the_rows(tmp_path):
    model, branches = block_model(axis=2)
    on, off, want, seen = _run_both(model, tmp_path)
    np.testing.assert_allclose(on[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(on[0], off[0])
    assert _views_of_the_concat(seen) == branches


@pytest.mark.parametrize("kwargs,folded", [({"shared": True}, 5), ({"graph_output": True}, 5), ({"n": 2}, 0)])
def test_left_alone_where_it_must_be(tmp_path, kwargs, folded):
    model, branches = block_model(**kwargs)
    on, off, want, seen = _run_both(model, tmp_path)
    for got, ref, other in zip(on, want, off):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(got, other)
    assert _views_of_the_concat(seen) == folded


def test_two_threads_at_once(tmp_path):
    from rpcsrv.client import compile_onnx

    model, _ = block_model()
    path = compile_onnx(model).export_library(str(tmp_path / "m.blob"))
    fn = next(f for f in _subgraph_functions(path) if f._into)
    xs = [RNG.standard_normal(fn.inputs[0].shape).astype("float32") for _ in range(2)]
    want = []
    for x in xs:
        outs = [np.empty(o.shape, o.dtype) for o in fn.outputs]
        fn(x, *outs)
        want.append(outs)
    bad = []

    def worker(k):
        for _ in range(30):
            outs = [np.empty(o.shape, o.dtype) for o in fn.outputs]
            fn(xs[k], *outs)
            bad.extend(k for g, w in zip(outs, want[k]) if not np.array_equal(g, w))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


TEXT = """block
  input 0 1 2 3 3
  relu 1 inputs: 0 shape: 1 2 3 3
  sigmoid 2 inputs: 0 shape: 1 2 3 3
  tanh 3 inputs: 0 shape: 1 2 3 3
  concat 4 inputs: 1 0 2 1 3 shape: 1 10 3 3 attrs: {"axis": 1}
  output 4
"""


def _text_run(kernels=None):
    from rpcsrv.executor import ExampleJSONRuntime
    from rpcsrv.executor.module import STEP_HOOK

    mod = ExampleJSONRuntime(TEXT, kernels)
    x = RNG.standard_normal((1, 2, 3, 3)).astype("float32")
    out = np.full((1, 10, 3, 3), np.nan, np.float32)
    seen = {}
    token = STEP_HOOK.set(lambda g, node, value, s: seen.__setitem__(node.id, value))
    try:
        mod.get_function("block")(x, out)
    finally:
        STEP_HOOK.reset(token)
    return mod, x, out, seen


def test_inputs_read_twice_and_graph_inputs_are_copied_in():
    mod, x, out, seen = _text_run()
    r = np.maximum(x, 0)
    np.testing.assert_allclose(out, np.concatenate([r, x, 1 / (1 + np.exp(-x)), r, np.tanh(x)], axis=1),
                               rtol=1e-6, atol=1e-6)
    assert sorted(mod.functions["block"]._into) == [2, 3]  # the relu is read twice: copied in, as the input
    assert seen[2].base is seen[4] and seen[3].base is seen[4] and seen[1].base is not seen[4]


def test_a_producer_that_breaks_its_declaration_is_still_reported():
    from rpcsrv.executor import ExecutorError
    from rpcsrv.executor.kernels import KERNELS

    bad = dict(KERNELS, tanh=lambda x: np.tanh(x)[:, :1])
    with pytest.raises(ExecutorError, match="kernel produced float32 \\[1, 1, 3, 3\\]"):
        _text_run(bad)


def test_without_the_compiled_kernels_every_producer_copies_into_its_slice(tmp_path, monkeypatch):
    from rpcsrv.executor.kernels.clib import compiled

    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    PLANS.clear()
    try:
        model, branches = block_model(s=32)
        on, off, want, seen = _run_both(model, tmp_path)
    finally:
        monkeypatch.delenv("RPCSRV_COMPILED_KERNELS")
        compiled.reset()
    np.testing.assert_allclose(on[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(on[0], off[0])
    assert _views_of_the_concat(seen) == branches
    assert PLANS and not any(into for _, into in PLANS)  # the table kernels: no out=
