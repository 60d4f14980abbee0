"""A Conv's bias moved through the 1x1 Conv that alone reads it (rpcsrv.client.compiler.simplify.fold_bias_forward):
ShuffleNet's depthwise conv + folded BatchNorm then grouped 1x1 conv.  Checked against onnxruntime, and
left alone where it would change the result (padding in the 1x1 conv, a second reader, a kernel > 1)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client.compiler.onnx_import import import_onnx
from rpcsrv.client.compiler.simplify import fold_bias_forward
from rpcsrv.client.demo_models import sample_inputs
from compiler_helpers import make_model, reference, run_compiled
from conftest import need_module

RNG = np.random.default_rng(21)


def shuffle_unit(pads_b=(0, 0, 0, 0), kernel_b=1, groups_b=3, second_reader=False, stride_b=1):
    """x(1,12,9,9) → depthwise 3x3 conv (+bias) → grouped conv B (+bias) → out [, and → Relu → out2]."""
    c, m = 12, 6
    inits = {"wa": RNG.standard_normal((c, 1, 3, 3)).astype("float32"), "ba": RNG.standard_normal(c).astype("float32"),
             "wb": RNG.standard_normal((m, c // groups_b, kernel_b, kernel_b)).astype("float32"),
             "bb": RNG.standard_normal(m).astype("float32")}
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], group=c, pads=[1, 1, 1, 1], name="dw"),
             helper.make_node("Conv", ["a", "wb", "bb"], ["out"], group=groups_b, pads=list(pads_b),
                              strides=[stride_b, stride_b], name="pw")]
    side = (9 + pads_b[0] + pads_b[2] - kernel_b) // stride_b + 1
    outputs = [("out", [1, m, side, side])]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["a"], ["out2"], name="relu"))
        outputs.append(("out2", [1, c, 9, 9]))
    return make_model(nodes, [("x", [1, c, 9, 9])], outputs, inits)


def folds(model) -> int:
    return fold_bias_forward(import_onnx(model))


@pytest.mark.parametrize("groups_b,stride_b", [(1, 1), (3, 1), (6, 1), (3, 2)])
def test_bias_moves_into_the_pointwise_conv_and_results_stay(tmp_path, groups_b, stride_b):
    from rpcsrv.client import compile_onnx

    need_module("onnxruntime")
    model = shuffle_unit(groups_b=groups_b, stride_b=stride_b)
    assert folds(model) == 1
    compiled = compile_onnx(model)
    feed = sample_inputs(model, 3)
    for got, want in zip(run_compiled(compiled, feed, tmp_path), reference(model, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs", [{"pads_b": (1, 1, 1, 1), "kernel_b": 1}, {"kernel_b": 3, "pads_b": (1, 1, 1, 1)},
                                    {"second_reader": True}])
def test_left_alone_where_it_would_change_the_result(kwargs):
    assert folds(shuffle_unit(**kwargs)) == 0
