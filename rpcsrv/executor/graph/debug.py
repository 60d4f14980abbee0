"""The debug graph executor: TVM's ``GraphExecutorDebug`` (v0.19) as a layer over the graph executor.

It is the graph executor plus the functions TVM's debug tooling calls over RPC
(``src/runtime/graph_executor/debug/graph_executor_debug.cc``; the client side is
``python/tvm/contrib/debugger/debug_executor.py``, which writes the dump files itself from these
answers):

* ``run_individual(number, repeat, min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms,
  repeats_to_cooldown)`` → bytes: an int64 node count, then ``repeat`` float64 seconds per node
  (0 for input nodes), each node timed alone after one warm-up run of the whole graph;
* ``run_individual_node(index, number, repeat, ...)`` → ``repeat`` float64 seconds for one node;
* ``execute_node(i)`` runs the nodes after the last executed one up to ``i`` (from 0 when going
  back); ``get_node_output(i, k)`` copies output ``k`` of node ``i``, which must be the last executed;
* ``debug_get_output(node, [out])`` runs the graph up to ``node`` (index or name) and returns its
  first output (TVM indexes the entry by the node index; here it is the node's own entry);
* ``profile([collectors])`` and ``profile_rpc()`` → the report as TVM's ``Report.AsJSON`` text
  (the classic client decodes it with ``Report.from_json``; a Report object cannot travel over RPC).

rpcsrv's own additions (``rpcsrv_`` prefix; they look inside the functions of every module kind that
runs kernel steps, ExampleJSON subgraphs and JSON-runtime graphs, through
:data:`rpcsrv.executor.module.STEP_HOOK`):

* ``rpcsrv_profile_steps(number, repeat)`` → JSON: per node the seconds of each repeat and, for
  each ExampleJSON kernel step inside it, its seconds per repeat;
* ``rpcsrv_execute_node_steps(i)`` runs like ``execute_node(i)`` and keeps a copy of every kernel
  step's output inside node ``i`` → JSON list of the steps; ``rpcsrv_get_step_output(k)`` returns
  step ``k``'s array.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..module import STEP_HOOK, ExecutorError, RuntimeModule
from .executor import GraphExecutorModule, op_exec_node_ids, parse_create_args, zeros
from ...loader.graph_json import Graph


def time_calls(fn: Callable[[], Any], number: int, repeat: int, min_repeat_ms: int = 0,
               limit_zero_time_iterations: int = 100, cooldown_interval_ms: int = 0,
               repeats_to_cooldown: int = 1) -> list[float]:
    """Mean seconds per call of ``fn`` for each of ``repeat`` rounds of ``number`` calls, after one
    warm-up call; a round shorter than ``min_repeat_ms`` is redone with more calls (TVM's
    ``WrapTimeEvaluator`` rules)."""
    _check_timing(number, repeat, min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms,
                  repeats_to_cooldown)
    fn()
    out = []
    for i in range(repeat):
        n, zero_times = number, 0
        while True:
            start = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = time.perf_counter() - start
            zero_times += elapsed == 0
            if elapsed * 1e3 >= min_repeat_ms or zero_times >= limit_zero_time_iterations:
                break
            n = int(max(min_repeat_ms / (elapsed * 1e3 / n + 1e-12) + 1, n * 1.618))
        out.append(elapsed / n)
        if cooldown_interval_ms > 0 and (i + 1) % repeats_to_cooldown == 0:
            time.sleep(cooldown_interval_ms / 1e3)
    return out


def _check_timing(number: int, repeat: int, min_repeat_ms: int, limit_zero: int, cooldown_ms: int,
                  repeats_to_cooldown: int) -> None:
    for name, value, low in (("number", number, 1), ("repeat", repeat, 1), ("min_repeat_ms", min_repeat_ms, 0),
                             ("limit_zero_time_iterations", limit_zero, 0),
                             ("cooldown_interval_ms", cooldown_ms, 0),
                             ("repeats_to_cooldown", repeats_to_cooldown, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ExecutorError(f"{name} must be an integer >= {low}, got {value!r}")


def _shape_string(arrays: Sequence[np.ndarray]) -> str:
    """TVM's ``profiling::ShapeString``: ``float32[1, 3], int64[2]``."""
    return ", ".join(f"{a.dtype}[{', '.join(str(d) for d in a.shape)}]" for a in arrays)


def _us(seconds: float) -> dict:
    return {"microseconds": seconds * 1e6}


class GraphExecutorDebugModule(GraphExecutorModule):
    """A created debug graph executor (type key ``GraphExecutorDebug``)."""

    type_key = "GraphExecutorDebug"

    def __init__(self, graph: str | Graph, lib: Optional[RuntimeModule], devices: Sequence[Any], *,
                 allocate: Callable[[int], np.ndarray] = zeros):
        super().__init__(graph, lib, devices, allocate=allocate)
        self.last_executed_node = -1
        self._exec_pos = {nid: k for k, nid in enumerate(op_exec_node_ids(self.graph))}
        if len(self._exec_pos) != len(self.op_execs):
            raise ExecutorError("debug executor: the graph executor's call list does not match its graph")
        self.steps: list[tuple[dict, np.ndarray]] = []  # captured by rpcsrv_execute_node_steps
        self._api.update({
            "run_individual": self.run_individual, "run_individual_node": self.run_individual_node,
            "debug_get_output": self.debug_get_output, "execute_node": self.execute_node,
            "get_node_output": self.get_node_output, "profile": self.profile, "profile_rpc": self.profile_rpc,
            "rpcsrv_profile_steps": self.profile_steps, "rpcsrv_execute_node_steps": self.execute_node_steps,
            "rpcsrv_get_step_output": self.get_step_output,
        })

    # ------------------------------------------------------------------ nodes
    def node_call(self, nid: int) -> Optional[Callable[[], Any]]:
        """The call of node ``nid`` over the executor's current buffers, or None (inputs, ``__nop``)."""
        pos = self._exec_pos.get(nid)
        if pos is None:
            return None
        fn, args = self.op_execs[pos]
        return lambda: fn(*args)

    def _node_index(self, node: Any, what: str) -> int:
        nodes = self.graph.nodes
        if isinstance(node, str):
            for nid, n in enumerate(nodes):
                if n.name == node:
                    return nid
            raise ExecutorError(f"{what}: cannot find {node!r} among the graph's nodes")
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)):
            raise ExecutorError(f"{what}: the node must be an index or a name, got {type(node).__name__}")
        if not 0 <= int(node) < len(nodes):
            raise ExecutorError(f"{what}: node {int(node)} out of range (the graph has {len(nodes)} nodes)")
        return int(node)

    def _run_nodes(self, first: int, last: int) -> None:
        for nid in range(first, last + 1):
            call = self.node_call(nid)
            if call is not None:
                call()

    # ------------------------------------------------------------------ TVM's debug functions
    def run_individual(self, number: int, repeat: int = 1, min_repeat_ms: int = 0,
                       limit_zero_time_iterations: int = 100, cooldown_interval_ms: int = 0,
                       repeats_to_cooldown: int = 1) -> bytes:
        timing = (number, repeat, min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms,
                  repeats_to_cooldown)
        _check_timing(*timing)
        self.run()  # warm-up
        rows = [self._node_times(nid, *timing) for nid in range(len(self.graph.nodes))]
        flat = [0.0 if math.isnan(t) else t for row in rows for t in row]
        return struct.pack(f"<q{len(flat)}d", len(rows), *flat)

    def _node_times(self, nid: int, number: int, repeat: int, *rest: int) -> list[float]:
        call = self.node_call(nid)
        return [0.0] * repeat if call is None else time_calls(call, number, repeat, *rest)

    def run_individual_node(self, index: Any, number: int = 10, repeat: int = 1, min_repeat_ms: int = 0,
                            limit_zero_time_iterations: int = 100, cooldown_interval_ms: int = 0,
                            repeats_to_cooldown: int = 1) -> bytes:
        nid = self._node_index(index, "run_individual_node")
        _check_timing(number, repeat, min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms,
                      repeats_to_cooldown)
        times = self._node_times(nid, number, repeat, min_repeat_ms, limit_zero_time_iterations,
                                 cooldown_interval_ms, repeats_to_cooldown)
        return struct.pack(f"<{repeat}d", *times)

    def execute_node(self, node: Any) -> None:
        nid = self._node_index(node, "execute_node")
        if nid < self.last_executed_node:
            self._run_nodes(0, nid)
        elif nid > self.last_executed_node:
            self._run_nodes(self.last_executed_node + 1, nid)
        self.last_executed_node = nid

    def get_node_output(self, node: Any, index: Any = 0) -> np.ndarray:
        nid = self._node_index(node, "get_node_output")
        if nid != self.last_executed_node:
            raise ExecutorError(f"get_node_output: node {nid} is not the last executed node "
                                f"({self.last_executed_node}); call execute_node({nid}) first")
        width = self.graph.node_row_ptr[nid + 1] - self.graph.node_row_ptr[nid]
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= int(index) < width:
            raise ExecutorError(f"get_node_output: node {nid} has {width} output(s), asked for {index!r}")
        return self.data_entry[self.graph.entry_id(nid, int(index))].copy()

    def debug_get_output(self, node: Any, out: Any = None) -> Optional[np.ndarray]:
        nid = self._node_index(node, "debug_get_output")
        self._run_nodes(0, nid)
        data = self.data_entry[self.graph.entry_id(nid, 0)]
        if out is None:
            return data
        if not isinstance(out, np.ndarray) or out.shape != data.shape or out.dtype != data.dtype:
            raise ExecutorError(f"debug_get_output: out must be {data.dtype} {list(data.shape)}")
        np.copyto(out, data)
        return None

    def profile(self, collectors: Any = None) -> str:
        """One run timed node by node, after three warm-up runs; TVM's report as JSON text."""
        if collectors not in (None, [], ()):
            raise ExecutorError("profile: metric collectors are not available on this board (pass none)")
        for _ in range(3):
            self.run()
        g, calls = self.graph, []
        total_start = time.perf_counter()
        for nid in range(len(g.nodes)):
            call = self.node_call(nid)
            if call is None:
                continue
            node = g.nodes[nid]
            args = [self.data_entry[g.entry_id(s, i)] for s, i in node.inputs]
            args += [self.data_entry[g.entry_id(nid, k)] for k in range(node.num_outputs)]
            start = time.perf_counter()
            call()
            calls.append((node, args, time.perf_counter() - start))
        total = time.perf_counter() - total_start
        device = f"cpu{self.devices[0].device_id}"
        rows = []
        for node, args, seconds in calls:
            row = {"Argument Shapes": {"string": _shape_string(args)}, "Count": {"count": 1},
                   "Device": {"string": device}, "Duration (us)": _us(seconds), "Name": {"string": node.func_name},
                   "Percent": {"percent": seconds / total * 100 if total > 0 else 0.0}}
            for key, value in node.attrs.items():  # TVM reports the node's layout attributes too
                if "layout" in key:
                    row[key] = {"string": str(value)}
            if "hash" in node.attrs:
                row["Hash"] = {"string": str(node.attrs["hash"])}
            rows.append(row)
        report = {"calls": rows,
                  "device_metrics": {device: {"Count": {"count": 1}, "Device": {"string": device},
                                              "Duration (us)": _us(total), "Name": {"string": "Total"}}},
                  "configuration": {"Executor": {"string": "Graph"},
                                    "Number of threads": {"count": os.cpu_count() or 1}}}
        return json.dumps(report)

    def profile_rpc(self) -> str:
        return self.profile()

    # ------------------------------------------------------------------ rpcsrv's additions
    def profile_steps(self, number: int = 1, repeat: int = 1) -> str:
        """Seconds per node and per ExampleJSON kernel step inside it, for each repeat (JSON)."""
        _check_timing(number, repeat, 0, 100, 0, 1)
        self.run()  # warm-up
        g, nodes = self.graph, []
        for nid in range(len(g.nodes)):
            call = self.node_call(nid)
            if call is None:
                continue
            steps: dict[tuple, dict] = {}
            node_times, step_times = [], []

            def hook(symbol, enode, value, seconds, acc=step_times):
                acc.append(((symbol, enode.id), enode, value, seconds))

            for _ in range(repeat):
                step_times.clear()
                token = STEP_HOOK.set(hook)
                try:
                    start = time.perf_counter()
                    for _ in range(number):
                        call()
                    node_times.append((time.perf_counter() - start) / number)
                finally:
                    STEP_HOOK.reset(token)
                sums: dict[tuple, float] = {}
                for key, enode, value, seconds in step_times:
                    sums[key] = sums.get(key, 0.0) + seconds
                    if key not in steps:
                        steps[key] = {"symbol": key[0], "id": enode.id, "op": enode.op,
                                      "shape": list(value.shape), "dtype": str(value.dtype), "seconds": []}
                for key, step in steps.items():
                    step["seconds"].append(sums.get(key, 0.0) / number)
            node = g.nodes[nid]
            nodes.append({"index": nid, "name": node.name, "func_name": node.func_name, "seconds": node_times,
                          "steps": list(steps.values())})
        return json.dumps({"nodes": nodes})

    def execute_node_steps(self, node: Any) -> str:
        """``execute_node`` that keeps a copy of each kernel step's output inside the node."""
        nid = self._node_index(node, "rpcsrv_execute_node_steps")
        captured: list[tuple[dict, np.ndarray]] = []

        def hook(symbol, enode, value, seconds):
            info = {"symbol": symbol, "id": enode.id, "op": enode.op, "shape": list(value.shape),
                    "dtype": str(value.dtype), "seconds": seconds}
            captured.append((info, np.array(value, copy=True)))

        if nid <= self.last_executed_node:
            self._run_nodes(0, nid - 1)
        else:
            self._run_nodes(self.last_executed_node + 1, nid - 1)
        token = STEP_HOOK.set(hook)
        try:
            self._run_nodes(nid, nid)
        finally:
            STEP_HOOK.reset(token)
        self.last_executed_node = nid
        self.steps = captured
        return json.dumps([info for info, _ in captured])

    def get_step_output(self, index: Any) -> np.ndarray:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) \
                or not 0 <= int(index) < len(self.steps):
            raise ExecutorError(f"rpcsrv_get_step_output: step {index!r} out of range "
                                f"({len(self.steps)} captured by the last rpcsrv_execute_node_steps)")
        return self.steps[int(index)][1]


def create_graph_executor_debug(*args: Any, allocate: Callable[[int], np.ndarray] = zeros) -> GraphExecutorDebugModule:
    """``tvm.graph_executor_debug.create(graph_json, lib, device_type, device_id, ...)``."""
    graph_json, lib, devices = parse_create_args(args, "tvm.graph_executor_debug.create")
    return GraphExecutorDebugModule(graph_json, lib, devices, allocate=allocate)
