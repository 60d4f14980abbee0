"""Code generation: graph JSON for the whole model (each codegen writes its own functions' payloads:
ExampleJSON's text is ``examplejson.py``, re-exported here as ``examplejson_text``).

The graph JSON is what TVM's graph executor codegen writes for a fully offloaded model: one
``null`` node per model input (and per param), one ``tvm_op`` per external function (its symbol as
both ``name`` and ``func_name``, string attrs ``num_inputs``/``num_outputs``/``flatten_data``),
``arg_nodes``, ``heads``, ``node_row_ptr`` and per-entry ``shape``/``storage_id``/``dltype``.

The storage plan follows TVM's ``GraphPlanMemory``: model inputs and params get storage of their
own; each function output takes a free storage whose size is within a factor of 16 of what it needs
(the smallest big enough one, else the largest smaller one, which then grows), or a new one; an
entry's storage is freed after its last reader runs, except for the model's outputs.
"""

from __future__ import annotations

import json
import math

import numpy as np

from rpcsrv.protocol.dtypes import numpy_dtype

from .examplejson import examplejson_text  # noqa: F401  (its old home; rpcsrv.client.compare imports it here)
from .onnx_import import Graph
from .partition import Function

MATCH_RANGE = 16


def _nbytes(shape, dtype: str) -> int:
    return max(int(math.prod(shape)) * numpy_dtype(dtype).itemsize, 1)


class _Planner:
    """TVM's token allocator in small: free storages by size, reuse within a size range."""

    def __init__(self):
        self.sizes: list[int] = []
        self.free: list[int] = []

    def fresh(self, size: int) -> int:
        self.sizes.append(size)
        return len(self.sizes) - 1

    def request(self, size: int) -> int:
        bigger = [s for s in self.free if size <= self.sizes[s] <= size * MATCH_RANGE]
        smaller = [s for s in self.free if size // MATCH_RANGE <= self.sizes[s] < size]
        if bigger:
            sid = min(bigger, key=lambda s: (self.sizes[s], s))
        elif smaller:
            sid = max(smaller, key=lambda s: (self.sizes[s], -s))
            self.sizes[sid] = size
        else:
            return self.fresh(size)
        self.free.remove(sid)
        return sid

    def release(self, sid: int) -> None:
        self.free.append(sid)


def graph_json(graph: Graph, functions: list[Function], params: dict[str, np.ndarray]) -> str:
    """The graph executor's JSON for inputs → external function calls → outputs."""
    nodes, entry, shapes, dtypes, sids = [], {}, [], [], []
    planner = _Planner()
    row_ptr = [0]

    def add_node(node: dict, outs: list[str], storage: list[int]) -> None:
        for k, t in enumerate(outs):
            entry[t] = (len(nodes), k)
            info = graph.tensors[t]
            shapes.append(list(info.shape))
            dtypes.append(info.dtype)
        sids.extend(storage)
        nodes.append(node)
        row_ptr.append(row_ptr[-1] + len(outs))

    for name in list(graph.inputs) + list(params):
        info = graph.tensors[name]
        add_node({"op": "null", "name": name, "inputs": []}, [name],
                 [planner.fresh(_nbytes(info.shape, info.dtype))])
    readers: dict[str, int] = {}
    for fn in functions:
        for t in fn.inputs:
            readers[t] = readers.get(t, 0) + 1
    pinned = set(graph.outputs) | set(graph.inputs) | set(params)
    storage_of: dict[str, int] = {}
    for fn in functions:
        storage = []
        for t in fn.outputs:
            info = graph.tensors[t]
            storage.append(planner.request(_nbytes(info.shape, info.dtype)))
            storage_of[t] = storage[-1]
        attrs = {"func_name": fn.symbol, "flatten_data": "0", "num_inputs": str(len(fn.inputs)),
                 "num_outputs": str(len(fn.outputs))}
        add_node({"op": "tvm_op", "name": fn.symbol, "attrs": attrs,
                  "inputs": [[*entry[t], 0] for t in fn.inputs]}, fn.outputs, storage)
        for t in fn.inputs:
            readers[t] -= 1
            if readers[t] == 0 and t not in pinned:
                planner.release(storage_of[t])
        for t in fn.outputs:
            if readers.get(t, 0) == 0 and t not in pinned:
                planner.release(storage_of[t])
    arg_nodes = [i for i, n in enumerate(nodes) if n["op"] == "null"]
    doc = {
        "nodes": nodes,
        "arg_nodes": arg_nodes,
        "heads": [[*entry[t], 0] for t in graph.outputs],
        "attrs": {"dltype": ["list_str", dtypes], "storage_id": ["list_int", sids],
                  "shape": ["list_shape", shapes]},
        "node_row_ptr": row_ptr,
        # TVM's graph JSON reader stops at "metadata" (it must stay the last key): the ONNX names of
        # the outputs (heads), for ``byoc run``'s npz and ``rpcsrv inspect``
        "metadata": {"output_names": list(graph.outputs)},
    }
    return json.dumps(doc, indent=2)
