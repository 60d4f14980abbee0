"""The debug executor in-process: TVM's node-by-node semantics, its answers' formats, bad arguments,
and the ExampleJSON step hook it uses to look inside subgraphs."""

from __future__ import annotations

import json
import struct
import threading

import numpy as np
import pytest

from debug_helpers import CHAIN, chain_graph_json, chain_inputs, chain_reference
from exec_helpers import GraphBuilder
from rpcsrv.executor import ExecutorError
from rpcsrv.executor.graph.debug import GraphExecutorDebugModule, create_graph_executor_debug, time_calls
from rpcsrv.executor.examplejson.subgraphs import ExampleJSONRuntime
from rpcsrv.executor.module import STEP_HOOK
from rpcsrv.executor.graph.executor import create_graph_executor
from rpcsrv.executor.module import RuntimeModule
from rpcsrv.loader import save_param_dict
from rpcsrv.protocol.dtypes import Device


class Lib(RuntimeModule):
    """A library module whose functions are plain Python callables, importing the ExampleJSON module."""

    def __init__(self, funcs=None, imports=None):
        super().__init__(imports)
        self.funcs = funcs or {}

    def get_function(self, name):
        return self.funcs.get(name)


def chain_debug(calls=None):
    ej = ExampleJSONRuntime(CHAIN)
    if calls is not None:  # count the calls of each subgraph
        funcs = {}
        for sym in ("mm_0", "ew_1", "tail_2"):
            def counted(*args, _f=ej.get_function(sym), _s=sym):
                calls.append(_s)
                _f(*args)
            funcs[sym] = counted
        lib = Lib(funcs)
    else:
        lib = Lib(imports=[ej])
    dbg = create_graph_executor_debug(chain_graph_json(), lib, 1, 0)
    x, w, b = chain_inputs()
    for name, value in (("x", x), ("w", w), ("b", b)):
        dbg.set_input(name, value)
    return dbg, [x, w, b, *chain_reference(x, w, b)]


def test_execute_node_runs_forward_and_restarts_when_going_back():
    calls = []
    dbg, expected = chain_debug(calls)
    dbg.execute_node(4)
    assert calls == ["mm_0", "ew_1"]
    np.testing.assert_allclose(dbg.get_node_output(4, 0), expected[4], rtol=1e-4, atol=1e-5)
    dbg.execute_node(5)
    assert calls == ["mm_0", "ew_1", "tail_2"]
    dbg.execute_node(5)  # the same node again: nothing runs
    assert len(calls) == 3
    dbg.execute_node(3)  # going back starts from the first node
    assert calls[3:] == ["mm_0"]
    out = dbg.get_node_output("mm_0", 0)
    np.testing.assert_allclose(out, expected[3], rtol=1e-4, atol=1e-5)
    out[:] = 0  # a copy: the executor's own storage is untouched
    assert dbg.get_node_output(3, 0).any()


def test_debug_get_output_by_index_or_name_and_into_out():
    dbg, expected = chain_debug()
    np.testing.assert_allclose(dbg.debug_get_output("ew_1"), expected[4], rtol=1e-4, atol=1e-5)
    out = np.empty((64, 64), np.float32)
    assert dbg.debug_get_output(5, out) is None
    np.testing.assert_allclose(out, expected[5], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(dbg.debug_get_output("x"), expected[0])  # an input node: nothing runs


def test_run_individual_layout():
    dbg, _ = chain_debug()
    blob = dbg.run_individual(2, 3, 0, 100, 0, 1)
    assert len(blob) == 8 + 6 * 3 * 8
    (count,) = struct.unpack_from("<q", blob)
    times = np.frombuffer(blob, dtype="<f8", offset=8).reshape(count, 3)
    assert count == 6 and (times[:3] == 0).all() and (times[3:] > 0).all()
    assert struct.unpack("<2d", dbg.run_individual_node(0, 1, 2)) == (0.0, 0.0)
    assert all(t > 0 for t in struct.unpack("<2d", dbg.run_individual_node("mm_0", 1, 2)))


def test_profile_report_is_tvms_json():
    dbg, _ = chain_debug()
    report = json.loads(dbg.profile_rpc())
    assert set(report) == {"calls", "device_metrics", "configuration"}
    calls = report["calls"]
    assert [c["Name"]["string"] for c in calls] == ["mm_0", "ew_1", "tail_2"]
    for c in calls:  # every metric is one {"kind": value} object, as Report.from_json expects
        assert all(len(v) == 1 and next(iter(v)) in ("string", "count", "microseconds", "percent")
                   for v in c.values())
    total = report["device_metrics"]["cpu0"]["Duration (us)"]["microseconds"]
    assert sum(c["Duration (us)"]["microseconds"] for c in calls) <= total
    assert report["configuration"]["Executor"] == {"string": "Graph"}
    with pytest.raises(ExecutorError, match="collectors"):
        dbg.profile(["papi"])


def test_profile_steps_and_step_outputs_see_inside_subgraphs():
    dbg, expected = chain_debug()
    x, w, b = expected[:3]
    nodes = json.loads(dbg.profile_steps(2, 3))["nodes"]
    assert [n["name"] for n in nodes] == ["mm_0", "ew_1", "tail_2"]
    assert [(s["op"], s["id"]) for s in nodes[0]["steps"]] == [("matmul", 2), ("matmul", 3), ("matmul", 4)]
    assert all(len(s["seconds"]) == 3 and min(s["seconds"]) > 0 for n in nodes for s in n["steps"])
    steps = json.loads(dbg.execute_node_steps("ew_1"))
    assert [s["op"] for s in steps] == ["add", "mul"]
    np.testing.assert_allclose(dbg.get_step_output(0), expected[3] + b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dbg.get_step_output(1), expected[4], rtol=1e-4, atol=1e-5)
    assert dbg.last_executed_node == 4
    with pytest.raises(ExecutorError, match="step 2 out of range"):
        dbg.get_step_output(2)
    assert STEP_HOOK.get() is None  # the hook never outlives the call


def test_step_hook_is_per_thread():
    ej = ExampleJSONRuntime(CHAIN)
    fn = ej.get_function("tail_2")
    a, b, out = (np.ones((64, 64), np.float32) for _ in range(3))
    seen, other = [], []
    token = STEP_HOOK.set(lambda *args: seen.append(args[1].op))
    try:
        thread = threading.Thread(target=lambda: (fn(a, b, out), other.append(STEP_HOOK.get())))
        thread.start()
        thread.join()
        fn(a, b, out)
    finally:
        STEP_HOOK.reset(token)
    assert other == [None] and seen == ["sub"]


def test_nop_nodes_have_no_call_and_take_no_time():
    g = GraphBuilder()
    x = g.input("x", (4,))
    r = g.op("__nop", [x], [((2, 2), "float32")], sids=[0])
    dbg = GraphExecutorDebugModule(g.json([r]), Lib(), [Device(1, 0)])
    assert dbg.node_call(1) is None
    blob = dbg.run_individual(1, 1)
    assert np.frombuffer(blob, "<f8", offset=8).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("call,match", [
    (lambda d: d.run_individual(0, 1), "number must be an integer >= 1"),
    (lambda d: d.run_individual(1, 1, -1), "min_repeat_ms must be an integer >= 0"),
    (lambda d: d.run_individual_node(9, 1, 1), "node 9 out of range"),
    (lambda d: d.execute_node("nope"), "cannot find 'nope'"),
    (lambda d: d.execute_node(1.5), "must be an index or a name"),
    (lambda d: d.get_node_output(3, 0), "not the last executed node"),
    (lambda d: (d.execute_node(3), d.get_node_output(3, 1)), "has 1 output"),
    (lambda d: d.debug_get_output(3, np.empty(3, np.float32)), "out must be float32"),
])
def test_bad_arguments_are_clear_errors(call, match):
    dbg, _ = chain_debug()
    with pytest.raises(ExecutorError, match=match):
        call(dbg)


@pytest.mark.parametrize("args,match", [
    ((chain_graph_json(), "lib", 1, 0), "must be a module"),
    ((42, Lib(), 1, 0), "graph JSON text"),
    ((chain_graph_json(), Lib()), "expects \\(graph_json, module, device_type, device_id"),
    ((chain_graph_json(), Lib(), 1), "integer pairs"),
    ((chain_graph_json(), Lib(), 2, 0), "not available on this board"),
    ((chain_graph_json(), Lib(), 1, 0), "no such function in module: mm_0"),
])
def test_create_arguments(args, match):
    with pytest.raises(ExecutorError, match=match):
        create_graph_executor(*args)


def test_create_skips_a_linked_param_lookup_and_takes_devices():
    lib = Lib(imports=[ExampleJSONRuntime(CHAIN)])
    ex = create_graph_executor(chain_graph_json(), lib, lambda name: None, 1, 0, Device(1, 0))
    assert [d.device_type for d in ex.devices] == [1, 1]
    x, w, b = chain_inputs()
    ex.load_params(save_param_dict({"w": w}))
    ex.set_input("x", x)
    ex.set_input("b", b)
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), chain_reference(x, w, b)[-1], rtol=1e-4, atol=1e-5)


def test_time_calls_honours_min_repeat_ms():
    calls = []
    times = time_calls(lambda: calls.append(1), number=1, repeat=2, min_repeat_ms=5)
    assert len(times) == 2 and len(calls) > 3  # the warm-up call, then rounds grown to 5 ms


def test_profile_reports_hash_and_layout_attributes():
    g = GraphBuilder()
    x = g.input("x", (64, 64))
    y = g.input("y", (64, 64))
    out = g.op("tail_2", [x, y], [((64, 64), "float32")])
    doc = json.loads(g.json([out]))
    doc["nodes"][out]["attrs"].update(hash="2ab7ece23a515b38", data_layout="NCHW")
    dbg = GraphExecutorDebugModule(json.dumps(doc), Lib(imports=[ExampleJSONRuntime(CHAIN)]), [Device(1, 0)])
    (call,) = json.loads(dbg.profile_rpc())["calls"]
    assert call["Hash"] == {"string": "2ab7ece23a515b38"} and call["data_layout"] == {"string": "NCHW"}
