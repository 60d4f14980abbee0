"""ShuffleNetV2's Concat + channel shuffle folded into one step (rpcsrv.executor.examplejson.shuffle_fold): small
ShuffleNetV2-style units built with onnx.helper (the halves taken by Slice, by opset-13 Split with the sizes
as an input, by opset-18 Split with ``num_outputs``; 2 groups and others, concat inputs spanning groups),
compiled by the real compiler, exported and run through the executor, against onnxruntime; the folded
chain is one step and the slices of it keep their values; and no fold where it would not compute what the
nodes compute (an intermediate read elsewhere or a subgraph output, another perm, no channel shuffle)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client import compile_onnx
from rpcsrv.executor import ExampleJSONRuntime, load_module
from rpcsrv.protocol.dtypes import Device
from conftest import need_module, need_program

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import make_model, reference  # noqa: E402

RNG = np.random.default_rng(27)
I64 = np.int64


def unit(nodes, inits, x, c, side, k, split, groups=2, opset=17, sizes=None):
    """One ShuffleNetV2 unit on ``x`` (1, c, side, side): halves by ``split`` ("slice", "split"), 1x1 conv +
    Relu on the second, Concat, the channel shuffle in ``groups``; returns its output's name.  ``sizes``:
    the two halves' channels (default c/2 each)."""
    h1, h2 = sizes or (c // 2, c - c // 2)
    p = f"u{k}_"
    if split == "slice":
        inits.update({p + "s0": np.array([0], I64), p + "s1": np.array([h1], I64), p + "s2": np.array([c], I64),
                      p + "ax": np.array([1], I64)})
        nodes += [helper.make_node("Slice", [x, p + "s0", p + "s1", p + "ax"], [p + "a"]),
                  helper.make_node("Slice", [x, p + "s1", p + "s2", p + "ax"], [p + "b"])]
    elif opset >= 18 and h1 == h2:
        nodes.append(helper.make_node("Split", [x], [p + "a", p + "b"], axis=1, num_outputs=2))
    else:
        inits[p + "sizes"] = np.array([h1, h2], I64)
        nodes.append(helper.make_node("Split", [x, p + "sizes"], [p + "a", p + "b"], axis=1))
    inits.update({p + "w": RNG.standard_normal((h2, h2, 1, 1)).astype("float32"),
                  p + "bias": RNG.standard_normal(h2).astype("float32"),
                  p + "r1": np.array([1, groups, c // groups, side, side], I64),
                  p + "r2": np.array([1, c, side, side], I64)})
    nodes += [helper.make_node("Conv", [p + "b", p + "w", p + "bias"], [p + "conv"]),
              helper.make_node("Relu", [p + "conv"], [p + "relu"]),
              helper.make_node("Concat", [p + "a", p + "relu"], [p + "cat"], axis=1),
              helper.make_node("Reshape", [p + "cat", p + "r1"], [p + "split"]),
              helper.make_node("Transpose", [p + "split"], [p + "t"], perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", [p + "t", p + "r2"], [p + "out"])]
    return p + "out"


def model(split="slice", groups=2, opset=17, c=12, side=5, units=2, sizes=None, tail=True):
    """``units`` units in a row; ``tail``: a last Slice pair on the result (the next unit's halves) as the outputs,
    else the last unit's shuffled tensor."""
    nodes, inits, x = [], {}, "x"
    for k in range(units):
        x = unit(nodes, inits, x, c, side, k, split, groups, opset, sizes)
    outputs = [x]
    if tail:
        inits.update({"t0": np.array([0], I64), "t1": np.array([c // 2], I64), "t2": np.array([c], I64),
                      "tax": np.array([1], I64)})
        nodes += [helper.make_node("Slice", [x, "t0", "t1", "tax"], ["left"]),
                  helper.make_node("Slice", [x, "t1", "t2", "tax"], ["right"])]
        outputs = ["left", "right"]
    shapes = {"left": [1, c // 2, side, side], "right": [1, c - c // 2, side, side], x: [1, c, side, side]}
    return make_model(nodes, [("x", [1, c, side, side])], [(o, shapes[o]) for o in outputs], inits, opset=opset)


def run(m, tmp_path):
    """(outputs, ops of the run's steps) of ``m`` compiled, exported and loaded by the executor."""
    feed = {"x": RNG.standard_normal((1,) + tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)[1:])
            .astype("float32")}
    compiled = compile_onnx(m)
    path = compiled.export_library(str(tmp_path / "m.blob"), fmt="blob")
    gmod = load_module(path).get_function("default")(Device(1, 0))
    gmod.get_function("set_input")("x", feed["x"])
    gmod.get_function("run")()
    got = [np.array(gmod.get_function("get_output")(i)) for i in range(len(compiled.output_names))]
    ops = [step[0].op for f in gmod._functions.values() for step in getattr(f, "steps", ())]
    return got, reference(m, feed), ops


@pytest.mark.parametrize("split,opset", [("slice", 17), ("split", 13), ("split", 18)])
@pytest.mark.parametrize("groups,sizes", [(2, None), (3, None), (4, (5, 7)), (6, (9, 3))])
def test_folded_units_match_onnxruntime(tmp_path, split, opset, groups, sizes):
    need_module("onnxruntime")
    got, want, ops = run(model(split, groups, opset, sizes=sizes), tmp_path)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert "concat" not in ops and "transpose" not in ops  # each unit's chain folded into one step
    assert ops.count("reshape") == 2


@pytest.mark.parametrize("tail", [True, False])
def test_the_shuffled_tensor_as_output_and_stride_two_style_readers(tmp_path, tail):
    """The folded tensor is a subgraph output itself, or read by two convs (the stride-2 unit's branches)."""
    need_module("onnxruntime")
    m = model(tail=tail, units=1)
    if tail:  # two convs read the shuffled tensor, as in the stride-2 units
        w = RNG.standard_normal((12, 12, 1, 1)).astype("float32")
        m.graph.initializer.append(helper.make_tensor("w2", 1, w.shape, w.ravel()))
        m.graph.node.append(helper.make_node("Conv", ["u0_out", "w2"], ["c2"]))
        m.graph.output.append(helper.make_tensor_value_info("c2", 1, [1, 12, 5, 5]))
    got, want, ops = run(m, tmp_path)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert "concat" not in ops and "transpose" not in ops


def edit(m, **changes):
    """``m`` with a node attribute changed or an extra reader/output added."""
    if "perm" in changes:
        node = next(n for n in m.graph.node if n.op_type == "Transpose")
        node.attribute[0].ints[:] = changes["perm"]
    if "read" in changes:  # a Relu reading an intermediate, as an extra output
        name, shape = changes["read"]
        m.graph.node.append(helper.make_node("Relu", [name], ["extra"]))
        m.graph.output.append(helper.make_tensor_value_info("extra", 1, shape))
    if "output" in changes:
        name, shape = changes["output"]
        m.graph.output.append(helper.make_tensor_value_info(name, 1, shape))
    return m


@pytest.mark.parametrize("changes", [
    {"read": ("u0_cat", [1, 12, 5, 5])},         # the Concat read elsewhere too
    {"read": ("u0_split", [1, 2, 6, 5, 5])},     # the first Reshape read elsewhere too
    {"read": ("u0_t", [1, 6, 2, 5, 5])},         # the Transpose read elsewhere too
    {"output": ("u0_cat", [1, 12, 5, 5])},       # the Concat a graph output
    {"perm": [0, 2, 1, 4, 3]},                    # also swaps the spatial axes: no channel shuffle
])
def test_left_alone_where_the_chain_is_not_private_or_no_shuffle(tmp_path, changes):
    need_module("onnxruntime")
    m = model(units=1)
    if "perm" in changes:
        del m.graph.output[:]
        m.graph.output.append(helper.make_tensor_value_info("u0_out", 1, [1, 12, 5, 5]))
        m.graph.node.pop()
        m.graph.node.pop()
    got, want, ops = run(edit(m, **changes), tmp_path)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert "concat" in ops and "transpose" in ops


def text(r1=(1, 2, 3, 2, 2), r1_decl=(1, 2, 3, 2, 2), axis=1) -> tuple[str, dict]:
    """An ExampleJSON chain: concat of inputs 0 and 1 (1, 3, 2, 2) → reshape → transpose → reshape."""
    lines = ["sub", "  input 0 1 3 2 2", "  input 1 1 3 2 2",
             f"  const 2 {len(r1)} dtype: int64 name: r1", "  const 3 4 dtype: int64 name: r2",
             f'  concat 4 inputs: 0 1 shape: 1 6 2 2 attrs: {{"axis": {axis}}}',
             f"  reshape 5 inputs: 4 2 shape: {' '.join(map(str, r1_decl))}",
             '  transpose 6 inputs: 5 shape: 1 3 2 2 2 attrs: {"perm": [0, 2, 1, 3, 4]}',
             "  reshape 7 inputs: 6 3 shape: 1 6 2 2", "  output 7"]
    return "\n".join(lines) + "\n", {"r1": np.array(r1, I64), "r2": np.array([1, 6, 2, 2], I64)}


def test_a_shape_constant_that_disagrees_fails_as_the_nodes_would():
    """The folded step checks its bound shape constants once: a Reshape whose constant does not give the
    declared shape is an error, not a silently different layout."""
    from rpcsrv.executor import ExecutorError

    a, b = RNG.standard_normal((2, 1, 3, 2, 2)).astype("float32")
    out = np.empty((1, 6, 2, 2), np.float32)
    code, consts = text()
    mod = ExampleJSONRuntime(code)
    mod.bind("sub", consts, "test")
    mod.get_function("sub")(a, b, out)
    want = np.concatenate([a, b], 1).reshape(1, 2, 3, 2, 2).transpose(0, 2, 1, 3, 4).reshape(1, 6, 2, 2)
    np.testing.assert_array_equal(out, want)
    assert [s[0].op for s in mod.functions["sub"].steps] == ["reshape"]
    code, consts = text(r1=(1, 3, 2, 2, 2))
    mod = ExampleJSONRuntime(code)
    mod.bind("sub", consts, "test")
    with pytest.raises(ExecutorError, match=r"reshape gives \[1, 3, 2, 2, 2\], the node declares \[1, 2, 3, 2, 2\]"):
        mod.get_function("sub")(a, b, out)


def test_no_fold_along_another_axis():
    """A concat along axis 0 is no channel shuffle's: the nodes stay, and the table kernels report the
    declared shape the concat does not give."""
    from rpcsrv.executor import ExecutorError

    code, consts = text(axis=0)
    mod = ExampleJSONRuntime(code)
    mod.bind("sub", consts, "test")
    assert [s[0].op for s in mod.functions["sub"].steps] == ["concat", "reshape", "transpose", "reshape"]
    a = np.zeros((1, 3, 2, 2), np.float32)
    with pytest.raises(ExecutorError, match="concat node 4"):
        mod.get_function("sub")(a, a, np.empty((1, 6, 2, 2), np.float32))


def test_the_slices_of_a_folded_shuffle_follow_rebound_constants():
    """A Slice of the folded tensor keeps its index per bound constants: binding other starts and ends
    gives the other half."""
    code, consts = text()
    code = code.replace("  output 7", "  const 8 1 dtype: int64 name: s0\n  const 9 1 dtype: int64 name: s1\n"
                        "  const 10 1 dtype: int64 name: ax\n  slice 11 inputs: 7 8 9 10 shape: 1 3 2 2\n  output 11")
    mod = ExampleJSONRuntime(code)
    a, b = RNG.standard_normal((2, 1, 3, 2, 2)).astype("float32")
    shuffled = np.concatenate([a, b], 1).reshape(1, 2, 3, 2, 2).transpose(0, 2, 1, 3, 4).reshape(1, 6, 2, 2)
    out = np.empty((1, 3, 2, 2), np.float32)
    for lo in (0, 3, 0):
        mod.bind("sub", {**consts, "s0": np.array([lo], I64), "s1": np.array([lo + 3], I64),
                         "ax": np.array([1], I64)}, "test")
        mod.get_function("sub")(a, b, out)
        np.testing.assert_array_equal(out, shuffled[:, lo:lo + 3])
    assert [s[0].op for s in mod.functions["sub"].steps] == ["reshape", "slice"]


@pytest.mark.parametrize("conv_group,planned", [(1, True), (2, False), (12, False)])
def test_a_concat_read_by_a_shuffling_conv(tmp_path, conv_group, planned):
    """The compiler merges a shuffle read by one conv into it (``input_shuffle``: ShuffleNetV2's last 1x1 conv).
    The Concat before it stays (its step keeps the ONNX Concat's value, for ``byoc compare``); a conv that
    is not depthwise gets its plan where the plain conv has one (not grouped 3x3s), with the shuffled copy the
    table kernel makes (``plans_conv.shuffled_conv_plan``);
    a depthwise one reads the shuffle in place as before."""
    need_module("onnxruntime")
    need_program("cc", "the conv plans call the compiled kernels, built with the board's C compiler")
    m = model(units=1, tail=False)
    w = RNG.standard_normal((12, 12 // conv_group, 3, 3)).astype("float32")
    m.graph.initializer.append(helper.make_tensor("w2", 1, w.shape, w.ravel()))
    m.graph.node.append(helper.make_node("Conv", ["u0_out", "w2"], ["y"], group=conv_group, pads=[1, 1, 1, 1]))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("y", 1, [1, 12, 5, 5]))
    compiled = compile_onnx(m)
    assert '"input_shuffle": 2' in compiled.subgraphs[0].code
    got, want, ops = run(m, tmp_path)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert ops == ["slice", "slice", "conv", "concat", "conv"]
    path = compiled.export_library(str(tmp_path / "m2.blob"), fmt="blob")
    fn = next(iter(load_module(path).get_function("default")(Device(1, 0))._functions.values()))
    kernel = fn.steps[-1][1]
    assert ("shuffled_conv_plan" in kernel.__qualname__) is planned


@pytest.mark.parametrize("group,kernel_side", [(1, 1), (1, 3), (3, 1), (2, 3)])
def test_the_shuffled_conv_plan_against_the_table_kernel(group, kernel_side):
    need_program("cc", "the conv plans call the compiled kernels, built with the board's C compiler")
    from rpcsrv.executor.kernels import KERNELS
    from rpcsrv.executor.kernels.plans import plan

    x = RNG.standard_normal((1, 12, 6, 7)).astype("float32")
    w = RNG.standard_normal((6, 12 // group, kernel_side, kernel_side)).astype("float32")
    b = RNG.standard_normal(6).astype("float32")
    pad = kernel_side // 2
    attrs = {"group": group, "kernel_shape": [kernel_side] * 2, "pads": [pad] * 4, "activation": "relu",
             "input_shuffle": 3}
    plain = {k: v for k, v in attrs.items() if k != "input_shuffle"}
    specs = [(x.shape, x.dtype), w, b], (1, 6, 6, 7), np.dtype("float32")
    fn = plan("conv", KERNELS["conv"], attrs, *specs)
    # planned exactly where the same conv without the shuffle is (grouped 3x3s are not)
    assert (fn is None) is (plan("conv", KERNELS["conv"], plain, *specs) is None) is (group == 2)
    if fn is None:
        return
    np.testing.assert_allclose(fn(x, w, b), KERNELS["conv"](x, w, b, **attrs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fn(x, w, b), KERNELS["conv"](
        x.reshape(1, 3, 4, 6, 7).swapaxes(1, 2).reshape(x.shape), w, b,
        **plain), rtol=1e-5, atol=1e-5)


def test_folded_on_the_numpy_fallback_too(tmp_path, monkeypatch):
    """The fold is numpy alone: a board without the compiled kernels runs it the same."""
    from rpcsrv.executor.kernels.clib import compiled

    need_module("onnxruntime")
    monkeypatch.setenv("RPCSRV_COMPILED_KERNELS", "0")
    compiled.reset()
    try:
        got, want, ops = run(model("split", 2, 13, units=3), tmp_path)
    finally:
        monkeypatch.undo()
        compiled.reset()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert "concat" not in ops and "transpose" not in ops


def test_every_step_keeps_its_onnx_tensor_value(tmp_path):
    """What ``byoc compare`` checks: each step that runs (the folded one under the last Reshape's ID, the
    slices of it) holds the value of the ONNX tensor its ID names (``client.compare``'s pairing)."""
    import onnx

    from rpcsrv.client.compare import onnx_intermediates, pair_subgraphs
    from rpcsrv.executor import module

    need_module("onnxruntime")
    m = model("slice", 2, units=2)
    onnx_path = str(tmp_path / "m.onnx")
    onnx.save(m, onnx_path)
    feed = {"x": RNG.standard_normal((1, 12, 5, 5)).astype("float32")}
    path = compile_onnx(m).export_library(str(tmp_path / "m.blob"), fmt="blob")
    _, pairs, _ = pair_subgraphs(path, onnx_path, {"x": (1, 12, 5, 5)})
    gmod = load_module(path).get_function("default")(Device(1, 0))
    gmod.get_function("set_input")("x", feed["x"])
    seen = []
    token = module.STEP_HOOK.set(lambda symbol, node, value, s: seen.append((symbol, node, value.copy())))
    try:
        gmod.get_function("run")()
    finally:
        module.STEP_HOOK.reset(token)
    names = {(symbol, node.id): pairs[symbol][node.id] for symbol, node, _ in seen}
    ref = onnx_intermediates(onnx_path, feed, sorted(set(names.values())))
    assert [node.op for _, node, _ in seen].count("reshape") == 2 and "u0_out" in names.values()
    for symbol, node, value in seen:
        np.testing.assert_allclose(value, ref[names[(symbol, node.id)]], rtol=1e-5, atol=1e-5)
