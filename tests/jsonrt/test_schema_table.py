"""The JSON-runtime op table names ops of the op language (``rpcsrv.loader.opset``) instead of describing them a
second time: each ``Direct`` row's kernel is an op of the schema and its relay attributes map onto the schema's
attributes; the input count, attribute kinds and values and dtype rules a node breaks are the schema's, refused
at load with the node named, as the ExampleJSON parser refuses them."""

from __future__ import annotations

import numpy as np
import pytest

from jsonrt_helpers import json_module, run_graph, with_consts
from rpcsrv.executor import ExecutorError, build_runtime
from rpcsrv.executor.jsonrt import table
from rpcsrv.executor.jsonrt.nn import ARITY, batch_norm, layer_norm
from rpcsrv.executor.jsonrt.tensor_ops import Direct
from rpcsrv.loader import build_blob, parse_blob
from rpcsrv.loader.jsonrt_graph import GraphBuilder
from rpcsrv.loader.opset import OPS


def test_every_direct_row_names_an_op_and_attributes_of_the_schema():
    rows = {name: f for name, f in table.OPS.items() if isinstance(f, Direct)}
    assert {"nn.relu", "add", "maximum", "clip", "nn.leaky_relu", "nn.softmax", "nn.relu6"} <= set(rows)
    for name, row in rows.items():
        assert row.kernel in OPS, name
        assert set(row.names.values()) | set(row.fixed) <= set(OPS[row.kernel].attrs), name
    assert ARITY[batch_norm] == 5 and ARITY[layer_norm] == 3  # the schema's input counts


def _build(op, inputs, shape, dtype="float32", **attrs):
    g = GraphBuilder()
    xs = [g.input(f"x{k}", s, d) for k, (s, d) in enumerate(inputs)]
    y = g.kernel(op, xs, shape, dtype, **attrs)
    return build_runtime(parse_blob(build_blob(with_consts(json_module(g, [y]), {}))))


@pytest.mark.parametrize("op,inputs,attrs,message", [
    ("nn.leaky_relu", [((4,), "float32")], {"alpha": "x"}, "attribute 'alpha' must be one number"),
    ("sigmoid", [((4,), "int32")], {}, "input x must be floating-point, got int32"),
    ("add", [((4,), "float32")] * 3, {}, "takes 2 required input(s), got 3"),
    ("subtract", [((4,), "float32"), ((4,), "int32")], {}, "inputs must share one dtype"),
    ("nn.softmax", [((4,), "float32")], {"axis": "1.5"}, "attribute 'axis' must be integers"),
])
def test_what_the_schema_refuses_is_refused_at_load(op, inputs, attrs, message):
    with pytest.raises(ExecutorError, match=rf"json module 'ext_0' node {len(inputs)} op '{op}': .*"
                                            + message.replace("(", r"\(").replace(")", r"\)")):
        _build(op, inputs, (4,), **attrs)


def test_schema_defaults_apply_where_relay_writes_nothing():
    g = GraphBuilder()
    x = g.input("x", (2, 3))
    y = g.kernel("nn.leaky_relu", [x], (2, 3))  # no alpha: the schema's default
    z = g.kernel("clip", [y], (2, 3), a_min=-0.5, a_max=0.25)
    v = np.array([[-2.0, -0.1, 0.1], [0.2, 0.3, 5.0]], "float32")
    (out,) = run_graph(g, [z], [v])
    alpha = OPS["leaky_relu"].attrs["alpha"].default
    np.testing.assert_allclose(out, np.clip(np.where(v >= 0, v, alpha * v), -0.5, 0.25), rtol=1e-6)
