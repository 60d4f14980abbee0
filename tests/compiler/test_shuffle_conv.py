"""A channel shuffle read by a Conv becomes the Conv's ``input_shuffle``
(rpcsrv.client.compiler.examplejson.merge_shuffles):
ShuffleNet's Reshape → Transpose → Reshape before its depthwise conv.  Checked against onnxruntime for depthwise,
grouped and plain convs, and left alone where the three nodes are no channel shuffle or a tensor between them has
another reader."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client.demo_models import sample_inputs
from compiler_helpers import make_model, reference, run_compiled
from conftest import need_module

RNG = np.random.default_rng(5)


def shuffle_model(groups=4, c=12, side=9, conv_groups=None, stride=1, perm=(0, 2, 1, 3, 4), back=None,
                  second_reader=False):
    """x (1, c, side, side) → Reshape (1, groups, c/groups, side, side) → Transpose(perm) → Reshape(back) → Conv 3x3."""
    conv_groups = c if conv_groups is None else conv_groups
    back = [1, c, side, side] if back is None else back
    split = [1, groups, c // groups, side, side]
    swapped = [split[p] for p in perm]
    inits = {"s1": np.array(split, np.int64), "s2": np.array(back, np.int64),
             "w": RNG.standard_normal((c, c // conv_groups, 3, 3)).astype("float32"),
             "b": RNG.standard_normal(c).astype("float32")}
    out_side = (side + 2 - 3) // stride + 1
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"], name="r1"),
             helper.make_node("Transpose", ["r1"], ["t"], perm=list(perm), name="t"),
             helper.make_node("Reshape", ["t", "s2"], ["r2"], name="r2"),
             helper.make_node("Conv", ["r2", "w", "b"], ["out"], group=conv_groups, pads=[1, 1, 1, 1],
                              strides=[stride, stride], name="conv")]
    outputs = [("out", [1, c, out_side, out_side])]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["t"], ["out2"], name="relu"))
        outputs.append(("out2", swapped))
    return make_model(nodes, [("x", [1, c, side, side])], outputs, inits)


def conv_attrs(compiled) -> list[dict]:
    import json

    found = []
    for sub in compiled.subgraphs:
        for line in sub.code.splitlines():
            if line.lstrip().startswith("conv ") and "attrs:" in line:
                found.append(json.loads(line.split("attrs:", 1)[1]))
    return found


def ops_of(compiled) -> list[str]:
    return [line.split()[0] for sub in compiled.subgraphs for line in sub.code.splitlines()[1:]
            if line.strip() and line.split()[0] not in ("input", "const", "output")]


@pytest.mark.parametrize("groups,conv_groups,stride,side", [
    (4, None, 1, 9),    # depthwise, shuffled in its layout copy
    (4, None, 2, 12),   # depthwise, stride 2 (row and column phases)
    (3, None, 1, 30),   # depthwise, wider than the column-phase limit
    (2, 4, 1, 9),       # grouped conv: shuffled copy first
    (3, 1, 1, 7),       # plain conv
])
def test_the_shuffle_rides_in_the_conv_and_results_stay(tmp_path, groups, conv_groups, stride, side):
    from rpcsrv.client import compile_onnx

    need_module("onnxruntime")
    model = shuffle_model(groups=groups, conv_groups=conv_groups, stride=stride, side=side)
    compiled = compile_onnx(model)
    assert ops_of(compiled) == ["conv"] and conv_attrs(compiled)[0]["input_shuffle"] == groups
    feed = sample_inputs(model, 3)
    for got, want in zip(run_compiled(compiled, feed, tmp_path), reference(model, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs", [
    {"perm": (0, 1, 2, 3, 4)},                     # no transpose of the group axes: no shuffle
    {"perm": (0, 2, 1, 4, 3)},                     # also swaps the spatial axes
    {"second_reader": True},                       # the transposed tensor is read elsewhere too
])
def test_left_alone_where_it_is_no_channel_shuffle(tmp_path, kwargs):
    from rpcsrv.client import compile_onnx

    need_module("onnxruntime")
    model = shuffle_model(**kwargs)
    compiled = compile_onnx(model)
    assert all("input_shuffle" not in attrs for attrs in conv_attrs(compiled))
    assert "transpose" in ops_of(compiled)
    feed = sample_inputs(model, 3)
    for got, want in zip(run_compiled(compiled, feed, tmp_path), reference(model, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_bad_input_shuffle_is_a_clear_error():
    from rpcsrv.executor.kernels import KERNELS

    x, w = np.ones((1, 6, 4, 4), np.float32), np.ones((6, 1, 3, 3), np.float32)
    for bad in (4, 0):
        with pytest.raises(ValueError, match=f"input_shuffle must be a divisor of C=6 .*got {bad}"):
            KERNELS["conv"](x, w, group=6, input_shuffle=bad)
