"""GELU's erf pattern made one Gelu op (rpcsrv.client.compiler.fuse.fuse_gelu), as PyTorch exports ``F.gelu``:
both orders of the half, Div by sqrt 2 or Mul by its inverse, the constants on either side.  The compiled
library is checked against onnxruntime on the unfused model; the pattern is left alone where fusing would
change the result or drop a tensor someone reads.  (The board's one-pass Gelu plan: tests/kernels/
test_plans_ops.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client.compiler.fuse import fuse_gelu
from rpcsrv.client.compiler.onnx_import import import_onnx
from compiler_helpers import make_model, reference, run_compiled
from conftest import need_module

SHAPE = [2, 7, 33]


def gelu_model(half_first=False, scale_op="Div", const_left=False, sqrt2=math.sqrt(2), one=1.0, half=0.5,
               extra_reader=False):
    """x → GELU by its five erf-form nodes (+ Tanh of the Erf's output when ``extra_reader``) → out."""
    inits = {"s": np.float32(sqrt2 if scale_op == "Div" else 1 / sqrt2), "one": np.float32(one),
             "half": np.float32(half)}

    def pair(a, b):
        return [b, a] if const_left else [a, b]

    nodes = [helper.make_node(scale_op, ["x", "s"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", pair("e", "one"), ["p"])]
    if half_first:
        nodes += [helper.make_node("Mul", pair("x", "half"), ["h"]), helper.make_node("Mul", ["h", "p"], ["out"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "p"], ["m"]), helper.make_node("Mul", pair("m", "half"), ["out"])]
    outputs = [("out", SHAPE)]
    if extra_reader:
        nodes.append(helper.make_node("Tanh", ["e"], ["t"]))
        outputs.append(("t", SHAPE))
    return make_model(nodes, [("x", SHAPE)], outputs, inits)


@pytest.mark.parametrize("half_first", [False, True], ids=["half_last", "half_first"])
@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
@pytest.mark.parametrize("const_left", [False, True], ids=["x_left", "const_left"])
def test_gelu_pattern_becomes_one_op_and_results_stay(tmp_path, half_first, scale_op, const_left):
    from rpcsrv.client import compile_onnx

    need_module("onnxruntime")
    model = gelu_model(half_first, scale_op, const_left)
    graph = import_onnx(model)
    assert fuse_gelu(graph) == 1
    assert [n.op_type for n in graph.nodes] == ["Gelu"] and graph.nodes[0].outputs == ["out"]
    x = (np.random.default_rng(4).standard_normal(SHAPE) * 3).astype(np.float32)
    x.flat[:4] = [0.0, -0.0, 40.0, -40.0]
    got = run_compiled(compile_onnx(model), {"x": x}, tmp_path)[0]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("kwargs", [{"sqrt2": 1.5}, {"one": 2.0}, {"half": 0.25}, {"extra_reader": True}],
                         ids=["scale", "one", "half", "erf_read_twice"])
def test_left_alone_where_it_would_change_the_result(kwargs):
    graph = import_onnx(gelu_model(**kwargs))
    assert fuse_gelu(graph) == 0
    assert "Erf" in [n.op_type for n in graph.nodes]
