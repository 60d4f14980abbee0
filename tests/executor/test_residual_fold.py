"""A residual Add folded into the 1x1 conv it adds (rpcsrv.executor.examplejson.residual_fold): the same values as
``onnx.reference`` running Conv then Add (then the fused activation), with and without the compiled kernels,
the Add no longer a step and the folded conv planned (``residual_pointwise``: bias, residual and
activation in one pass); inputs the plan was not made for run the folded kernel; and no fold where it
would be wrong (the conv's output read twice or a subgraph output, a 3x3 or activated conv)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rpcsrv.executor import ExampleJSONRuntime
from rpcsrv.executor.kernels.clib import compiled
from conftest import need_program

C, M = 7, 5
ACTS = {None: None, "relu": ("Relu", {}), "clip": ("Clip", {"min": 0.0, "max": 6.0}),
        "hard_swish": ("HardSwish", {}), "swish": ("Swish", {})}


@pytest.fixture(params=["compiled", "numpy"])
def kernels_mode(request, monkeypatch):
    if request.param == "compiled":
        need_program("cc", "the folded conv's plan calls the compiled kernels, built with the board's C compiler")
        monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    else:
        monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    yield request.param
    compiled.reset()


def text(h, w, act=None, bias=True, kernel=1, swap=False, op="add", extra_reader=False, conv_is_output=False,
         conv_act=None) -> str:
    """input 0 x (1, C, h, w), input 1 r (1, M, h', w'); conv 4 = conv(x, w[, b]); add 5 = conv + r."""
    pad = kernel // 2
    cattrs = {"kernel_shape": [kernel, kernel], "pads": [pad] * 4}
    if conv_act:
        cattrs["activation"] = conv_act
    aattrs = {} if act is None else {"activation": act}
    if act == "clip":
        aattrs["activation_attrs"] = {"min": 0.0, "max": 6.0}
    lines = ["blk", f"  input 0 1 {C} {h} {w}", f"  input 1 1 {M} {h} {w}",
             f"  const 2 {M} {C} {kernel} {kernel} name: w", f"  const 3 {M} name: b",
             f"  conv 4 inputs: 0 2{' 3' if bias else ''} shape: 1 {M} {h} {w} attrs: {json.dumps(cattrs)}",
             f"  {op} 5 inputs: {'1 4' if swap else '4 1'} shape: 1 {M} {h} {w}"
             + (f" attrs: {json.dumps(aattrs)}" if aattrs else "")]
    outs = ["5"]
    if extra_reader:
        lines.append(f"  relu 6 inputs: 4 shape: 1 {M} {h} {w}")
        outs.append("6")
    if conv_is_output:
        outs.append("4")
    return "\n".join(lines + ["  output " + " ".join(outs)]) + "\n"


def reference(x, r, w, b, act, kernel=1, conv_act=None):
    """Conv, then Add, then the activation: onnx.reference."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    pad = kernel // 2
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["c"],
                              kernel_shape=[kernel, kernel], pads=[pad] * 4)]
    src = "c"
    if conv_act:
        nodes.append(helper.make_node("Relu", ["c"], ["ca"]))
        src = "ca"
    nodes.append(helper.make_node("Add", [src, "r"], ["s"]))
    out = "s"
    if act == "swish":
        nodes += [helper.make_node("Sigmoid", ["s"], ["g"]), helper.make_node("Mul", ["s", "g"], ["y"])]
        out = "y"
    elif act is not None:
        op, attrs = ACTS[act]
        nodes.append(helper.make_node(op, ["s"], ["y"], **attrs) if op != "Clip" else
                     helper.make_node("Clip", ["s", "lo", "hi"], ["y"]))
        out = "y"
    inits = [helper.make_tensor(name, TensorProto.FLOAT, [], [v]) for name, v in (("lo", 0.0), ("hi", 6.0))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                           for n in ("x", "r", "w") + (("b",) if b is not None else ())],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": x, "r": r, "w": w} | ({"b": b} if b is not None else {})
    return ReferenceEvaluator(model).run(None, feeds)[0]


def run(src, h, w, kernel=1, bias=True):
    rng = np.random.default_rng(h * 31 + w)
    mod = ExampleJSONRuntime(src)
    wt = rng.standard_normal((M, C, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    mod.bind("blk", {"w": wt, "b": b}, "test")
    fn = mod.get_function("blk")
    fn.prepare()
    x = rng.standard_normal((1, C, h, w)).astype(np.float32)
    r = rng.standard_normal((1, M, h, w)).astype(np.float32)
    outs = [np.empty(node.shape, np.float32) for node in fn.outputs]
    fn(x, r, *outs)
    return fn, outs, (x, r, wt, b if bias else None)


@pytest.mark.parametrize("act", list(ACTS), ids=str)
@pytest.mark.parametrize("h,w,bias,swap,op", [(6, 6, True, False, "add"), (9, 13, False, True, "add"),
                                              (1, 17, True, True, "sum"), (11, 5, True, False, "sum")])
def test_folded_matches_onnx_reference(act, h, w, bias, swap, op, kernels_mode):
    fn, outs, (x, r, wt, b) = run(text(h, w, act, bias=bias, swap=swap, op=op), h, w, bias=bias)
    want = reference(x, r, wt, b, act)
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)
    names = [(step[0].op, getattr(step[1], "__name__", "")) for step in fn.steps]
    if kernels_mode == "compiled":
        assert names == [("conv", "residual_pointwise")]  # one step: conv, bias, residual, activation
    else:
        assert [n for n, _ in names] == ["conv", op]  # the numpy fallback keeps the graph


def test_plan_falls_back_on_other_inputs(monkeypatch):
    """A residual of another layout (a transposed view) or compiled kernels turned off after planning:
    the folded kernel, same values."""
    need_program("cc", "the folded conv's plan calls the compiled kernels, built with the board's C compiler")
    monkeypatch.delenv("RPCSRV_COMPILED_KERNELS", raising=False)
    compiled.reset()
    h = w = 6
    fn, _, (x, r, wt, b) = run(text(h, w, "relu"), h, w)
    want = reference(x, r, wt, b, "relu")
    step = fn.steps[0]
    rt = np.ascontiguousarray(r.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # same values, not C-contiguous
    got = step[1](x, fn.constants[2], fn.constants[3], rt)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert step[1].__name__ == "residual_pointwise"
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    np.testing.assert_allclose(step[1](x, fn.constants[2], fn.constants[3], r), want, rtol=1e-5, atol=1e-5)
    compiled.reset()


@pytest.mark.parametrize("case", ["extra_reader", "conv_is_output", "3x3", "conv_act"])
def test_no_fold_where_it_would_be_wrong(case, kernels_mode):
    h = w = 5
    kwargs, kernel = {}, 1
    if case in ("extra_reader", "conv_is_output"):
        kwargs[case] = True
    elif case == "3x3":
        kernel = 3
    else:
        kwargs["conv_act"] = "relu"
    fn, outs, (x, r, wt, b) = run(text(h, w, "relu", kernel=kernel, **kwargs), h, w, kernel=kernel)
    want = reference(x, r, wt, b, "relu", kernel=kernel, conv_act=kwargs.get("conv_act"))
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)
    assert "add" in [step[0].op for step in fn.steps]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("hw", [(7, 7), (3, 5)])  # the scale on the weights (M <= H*W) or on the input
def test_scaled_projection_folds_too(hw, bias, kernels_mode):
    """Squeeze-and-excitation's Mul (scale_fold), the 1x1 projection and the residual Add: one step,
    onnx.reference's values (Mul, Conv, Add)."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    h, w = hw
    src = "\n".join(["blk", f"  input 0 1 {C} {h} {w}", f"  input 1 1 {C} 1 1", f"  input 2 1 {M} {h} {w}",
                     f"  const 3 {M} {C} 1 1 name: w", f"  const 4 {M} name: b",
                     f"  mul 5 inputs: 0 1 shape: 1 {C} {h} {w}",
                     f"  conv 6 inputs: 5 3{' 4' if bias else ''} shape: 1 {M} {h} {w} attrs: "
                     '{"kernel_shape": [1, 1], "pads": [0, 0, 0, 0]}',
                     f"  add 7 inputs: 2 6 shape: 1 {M} {h} {w}", "  output 7"]) + "\n"
    rng = np.random.default_rng(h + w)
    wt, b = rng.standard_normal((M, C, 1, 1)).astype(np.float32), rng.standard_normal(M).astype(np.float32)
    mod = ExampleJSONRuntime(src)
    mod.bind("blk", {"w": wt, "b": b}, "test")
    fn = mod.get_function("blk")
    fn.prepare()
    x, s = rng.standard_normal((1, C, h, w)).astype(np.float32), rng.random((1, C, 1, 1)).astype(np.float32)
    r = rng.standard_normal((1, M, h, w)).astype(np.float32)
    out = np.empty((1, M, h, w), np.float32)
    fn(x, s, r, out)
    nodes = [helper.make_node("Mul", ["x", "s"], ["xs"]),
             helper.make_node("Conv", ["xs", "w"] + (["b"] if bias else []), ["c"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["r", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                           for n in ("x", "s", "r", "w") + (("b",) if bias else ())],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    want = ReferenceEvaluator(model).run(None, {"x": x, "s": s, "r": r, "w": wt} | ({"b": b} if bias else {}))[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    steps = [(step[0].op, getattr(step[1], "__name__", "")) for step in fn.steps]
    if kernels_mode == "compiled":
        assert steps == [("conv", "scaled_pointwise")]  # Mul, Conv and Add in one planned step
        got = fn.steps[0][1](x, s.reshape(C, 1, 1), fn.constants[3], fn.constants[4] if bias else None, r)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # a scale it was not planned for
    else:
        assert [op for op, _ in steps] == ["conv", "add"]  # scale_fold only
