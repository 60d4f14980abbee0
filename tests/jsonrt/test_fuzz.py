"""Random damage to real JSON-runtime graphs (the TensorRT fixture's and ACL's): the loader either reads
the graph or raises ``JSONGraphError``, and the executor either builds and runs it or raises
``ExecutorError``; nothing else escapes (a board answers bad libraries, it does not crash on them)."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jsonrt_helpers import EXPORTS
from rpcsrv.executor import ExecutorError
from rpcsrv.executor.jsonrt import JSONRuntime
from rpcsrv.extract import payload_entries
from rpcsrv.loader.jsonrt import JSON_RUNTIME_KEYS, JSONRuntimePayload, JSONRuntimeModule
from rpcsrv.loader.jsonrt_graph import JSONGraphError

GRAPHS = [JSONRuntimePayload.parse(raw) for path in sorted(EXPORTS.glob("*.so"))
          for key, raw in payload_entries(str(path)) if key in JSON_RUNTIME_KEYS]

VALUES = st.one_of(st.integers(-3, 40), st.text(max_size=6), st.none(), st.lists(st.integers(-2, 9), max_size=5),
                   st.lists(st.text(max_size=4), max_size=3), st.just([["NHWC"]]), st.just([["7", "x"]]))


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(GRAPHS) - 1), st.lists(st.tuples(st.integers(0, 10**6), VALUES), min_size=1, max_size=3))
def test_damaged_graphs_get_clear_errors(which, edits):
    payload = GRAPHS[which]
    doc = json.loads(payload.graph_json)
    for pick, value in edits:
        paths = list(_paths(doc))
        doc = _set(doc, paths[pick % len(paths)], json.loads(json.dumps(value)))  # a fresh copy each time
    mod = JSONRuntimeModule(payload.symbol, json.dumps(doc), list(payload.const_names), type_key="tensorrt")
    try:
        mod.graph
    except JSONGraphError:
        return
    try:
        rt = JSONRuntime(mod)
    except ExecutorError:
        return
    graph = mod.graph
    consts = {graph.nodes[n].name: np.ones(graph.nodes[n].shapes[0], graph.nodes[n].dtypes[0])
              for n in graph.const_nodes}
    args = [np.ones(graph.nodes[e.node].shapes[e.index], graph.nodes[e.node].dtypes[e.index])
            for e in graph.input_entries + graph.heads]
    try:
        rt.bind(consts, "the test")
        rt.run(*args)
    except ExecutorError:
        pass
