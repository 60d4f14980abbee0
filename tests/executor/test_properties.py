"""Property tests: random graphs give numpy's answers, with and without planned storage reuse."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_helpers import GraphBuilder
from rpcsrv.executor import ExampleJSONRuntime, GraphExecutorModule, RuntimeModule
from rpcsrv.protocol.dtypes import Device

CPU = Device(1, 0)
NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


@st.composite
def dags(draw, max_ops=12):
    """(number of inputs, [(op, a, b)]) where a, b index earlier values (inputs first)."""
    n_in = draw(st.integers(1, 4))
    ops = []
    for k in range(draw(st.integers(1, max_ops))):
        avail = n_in + k
        ops.append((draw(st.sampled_from(sorted(NUMPY))), draw(st.integers(0, avail - 1)),
                    draw(st.integers(0, avail - 1))))
    return n_in, ops


def reference(inputs, ops):
    values = list(inputs)
    for op, a, b in ops:
        values.append(NUMPY[op](values[a], values[b]))
    return values[-1]


@settings(max_examples=40, deadline=None)
@given(dags(), st.integers(0, 2**31 - 1))
def test_random_examplejson_subgraphs_match_numpy(dag, seed):
    n_in, ops = dag
    lines = ["sub_rand"] + [f"  input {i} 3 2" for i in range(n_in)]
    lines += [f"  {op} {n_in + k} inputs: {a} {b} shape: 3 2" for k, (op, a, b) in enumerate(ops)]
    mod = ExampleJSONRuntime("\n".join(lines))
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(n_in)]
    out = np.zeros((3, 2), np.float32)
    mod.get_function("sub_rand")(*inputs, out)
    np.testing.assert_allclose(out, reference(inputs, ops), rtol=1e-5, atol=1e-5)


class Ops(RuntimeModule):
    """Destination-passing functions, as compiled host ops are called: (a, b, out)."""

    def get_function(self, name):
        fn = NUMPY.get(name)
        return None if fn is None else (lambda a, b, out: fn(a, b, out=out))


def plan(n_in, ops, reuse: bool) -> list[int]:
    """Storage ids: with ``reuse``, an op output takes a buffer freed by a dead value (a simple
    liveness planner like TVM's), never one of its own inputs' buffers."""
    last = {}
    for k, (_, a, b) in enumerate(ops):
        last[a] = last[b] = k
    sids, free, next_sid = list(range(n_in)), [], n_in
    for k, (_, a, b) in enumerate(ops):
        if reuse and free:
            sids.append(free.pop())
        else:
            sids.append(next_sid)
            next_sid += 1
        for v in {a, b}:
            if v >= n_in and last[v] == k:
                free.append(sids[v])  # dead after this op: later outputs may take its buffer
    return sids


@settings(max_examples=40, deadline=None)
@given(dags(), st.integers(0, 2**31 - 1))
def test_planned_storage_reuse_gives_the_same_answers(dag, seed):
    n_in, ops = dag
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(4).astype(np.float32) for _ in range(n_in)]
    results = []
    for reuse in (False, True):
        sids = plan(n_in, ops, reuse)
        g = GraphBuilder()
        nids = [g.input(f"x{i}", (4,), sid=sids[i]) for i in range(n_in)]
        for k, (op, a, b) in enumerate(ops):
            nids.append(g.op(op, [nids[a], nids[b]], [((4,), "float32")], sids=[sids[n_in + k]]))
        ex = GraphExecutorModule(g.json([nids[-1]]), Ops(), [CPU])
        for i, x in enumerate(inputs):
            ex.set_input(i, x)
        ex.run()
        results.append(ex.get_output(0).copy())
        assert len(ex.pool) == len(set(sids))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)
    np.testing.assert_allclose(results[0], reference(inputs, ops), rtol=1e-5, atol=1e-5)
