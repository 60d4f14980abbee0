"""MatMul → Add(constant) (→ Relu) on operands of rank > 2 fuses into one ``matmul`` with a bias
input (the transformer projections); results match onnxruntime, other shapes stay separate."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client import compile_onnx
from rpcsrv.client.demo_models import sample_inputs
from compiler_helpers import make_model, reference, run_compiled
from conftest import need_module

RNG = np.random.default_rng(11)


def f32(*shape):
    return RNG.standard_normal(shape).astype("float32")


def projection_model(bias_shape, relu: bool, x_shape=(1, 6, 8)):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["bias", "h"], ["hb"], name="add")]  # bias first: either order
    out = "hb"
    if relu:
        nodes.append(helper.make_node("Relu", ["hb"], ["r"], name="relu"))
        out = "r"
    y_shape = list(x_shape[:-1]) + [5]
    return make_model(nodes, [("x", list(x_shape))], [(out, y_shape)],
                      {"w": f32(8, 5), "bias": f32(*bias_shape)})


@pytest.mark.parametrize("bias_shape, relu, x_shape", [
    ((5,), False, (1, 6, 8)), ((1, 1, 5), True, (1, 6, 8)), ((6, 5), True, (2, 6, 8)),
    ((1, 1, 1, 5), False, (2, 3, 6, 8)),
])
def test_projection_fuses_and_matches(bias_shape, relu, x_shape, tmp_path):
    need_module("onnxruntime")
    model = projection_model(bias_shape, relu, x_shape)
    compiled = compile_onnx(model)
    (sg,) = compiled.subgraphs
    assert sg.ops == ["matmul"]
    assert sg.patterns == ["examplejson.dense_bias_relu" if relu else "examplejson.dense_bias"]
    feed = sample_inputs(model, 2)
    np.testing.assert_allclose(run_compiled(compiled, feed, tmp_path)[0], reference(model, feed)[0],
                               rtol=1e-5, atol=1e-6)


def test_bias_that_grows_the_output_or_is_an_input_stays_an_add(tmp_path):
    need_module("onnxruntime")
    grows = projection_model((3, 1, 5), False)  # (1, 6, 5) + (3, 1, 5) -> (3, 6, 5)
    grows.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 3
    compiled = compile_onnx(grows)
    assert compiled.subgraphs[0].ops == ["matmul", "add"]
    feed = sample_inputs(grows, 2)
    np.testing.assert_allclose(run_compiled(compiled, feed, tmp_path)[0], reference(grows, feed)[0],
                               rtol=1e-5, atol=1e-6)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["out"])]
    model = make_model(nodes, [("x", [1, 6, 8]), ("b", [5])], [("out", [1, 6, 5])], {"w": f32(8, 5)})
    assert compile_onnx(model).subgraphs[0].ops == ["matmul", "add"]


def test_two_d_operands_still_become_gemm():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["out"])]
    model = make_model(nodes, [("x", [6, 8])], [("out", [6, 5])], {"w": f32(8, 5), "b": f32(5)})
    assert compile_onnx(model).subgraphs[0].ops == ["gemm"]
