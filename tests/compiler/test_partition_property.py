"""Random element-wise DAGs: partitions never form cycles, cover every node once, and compute right."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from rpcsrv.client import UnsupportedNodesError, compile_onnx
from compiler_helpers import make_model, run_compiled

UNARY = {"Relu": lambda a: np.maximum(a, 0), "Neg": np.negative, "Tanh": np.tanh}
BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}
KERNEL = {"Relu": "relu", "Neg": "neg", "Tanh": "tanh", "Add": "add", "Sub": "sub", "Mul": "mul"}


@st.composite
def dags(draw):
    """(nodes as (op, input indices)); tensor 0 and 1 are the inputs, node k makes tensor k+2."""
    n = draw(st.integers(1, 10))
    nodes = []
    for k in range(n):
        avail = k + 2
        op = draw(st.sampled_from(sorted(UNARY) + sorted(BINARY)))
        arity = 1 if op in UNARY else 2
        nodes.append((op, [draw(st.integers(0, avail - 1)) for _ in range(arity)]))
    return nodes


def _build(nodes):
    names = ["x", "y"] + [f"t{k}" for k in range(len(nodes))]
    onnx_nodes = [helper.make_node(op, [names[i] for i in ins], [names[k + 2]], name=f"n{k}")
                  for k, (op, ins) in enumerate(nodes)]
    used = {i for _, ins in nodes for i in ins}
    outs = [names[k + 2] for k in range(len(nodes)) if k + 2 not in used] or [names[-1]]
    model = make_model(onnx_nodes, [("x", [3]), ("y", [3])], [(o, [3]) for o in outs])
    return model, names, outs


def _reference(nodes, names, outs, feed):
    values = [feed["x"], feed["y"]]
    for op, ins in nodes:
        fn = UNARY.get(op) or BINARY[op]
        values.append(fn(*[values[i] for i in ins]))
    return [values[names.index(o)] for o in outs]


def _acyclic(units: list[tuple[set, set]]) -> bool:
    """units: (tensors read, tensors written); True when the unit graph has a topological order."""
    producer = {t: u for u, (_, outs) in enumerate(units) for t in outs}
    deps = [{producer[t] for t in ins if t in producer} - {u} for u, (ins, _) in enumerate(units)]
    done: set[int] = set()
    while len(done) < len(units):
        ready = [u for u in range(len(units)) if u not in done and deps[u] <= done]
        if not ready:
            return False
        done.update(ready)
    return True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=dags(), data=st.data())
def test_random_dags(nodes, data, tmp_path):
    model, names, outs = _build(nodes)
    ops = data.draw(st.sets(st.sampled_from(sorted(KERNEL.values())), min_size=1))
    needed = {KERNEL[op] for op, _ in nodes}
    if needed <= ops:
        compiled = compile_onnx(model, ops=sorted(ops))
        feed = {"x": np.array([-1.0, 0.5, 2.0], "float32"), "y": np.array([3.0, -2.0, 0.25], "float32")}
        got = run_compiled(compiled, feed, tmp_path)
        for g, w in zip(got, _reference(nodes, names, outs, feed)):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        subgraphs, unsupported = compiled.subgraphs, []
    else:
        with pytest.raises(UnsupportedNodesError) as info:
            compile_onnx(model, ops=sorted(ops), host_fallback=False)
        subgraphs, unsupported = info.value.partial.subgraphs, info.value.nodes
        assert {name for name, *_ in unsupported} == {f"n{k}" for k, (op, _) in enumerate(nodes)
                                                      if KERNEL[op] not in ops}
    # every supported node sits in exactly one subgraph (an Add+Relu composite is one op for two nodes)
    assert all(p == "examplejson.add_relu" for sg in subgraphs for p in sg.patterns)
    assert sum(len(sg.ops) + len(sg.patterns) for sg in subgraphs) == len(nodes) - len(unsupported)
    units = [(set(sg.inputs), set(sg.outputs)) for sg in subgraphs]
    for name, *_ in unsupported:
        k = int(name[1:])
        units.append(({names[i] for i in nodes[k][1]}, {names[k + 2]}))
    assert _acyclic(units), "the partition has a cycle between regions"
