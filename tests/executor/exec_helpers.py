"""Builders for the executor tests: graph JSON as TVM's codegen writes it, and the seed text."""

from __future__ import annotations

import json

SEED = """subgraph_0
  input 0 10 10
  input 1 10 10
  input 2 10 10
  input 3 10 10
  add 4 inputs: 0 1 shape: 10 10
  sub 5 inputs: 4 2 shape: 10 10
  mul 6 inputs: 5 3 shape: 10 10
"""


class GraphBuilder:
    """Writes graph JSON in TVM's layout (string op attrs, typed attr lists, node_row_ptr)."""

    def __init__(self):
        self.nodes, self.arg_nodes, self.row_ptr = [], [], [0]
        self.shape, self.dltype, self.storage_id = [], [], []

    def _entries(self, outs, sids):
        for (shape, dtype), sid in zip(outs, sids):
            self.shape.append(list(shape))
            self.dltype.append(dtype)
            self.storage_id.append(sid if sid is not None else len(self.storage_id))
        self.row_ptr.append(self.row_ptr[-1] + len(outs))

    def input(self, name, shape, dtype="float32", sid=None) -> int:
        nid = len(self.nodes)
        self.nodes.append({"op": "null", "name": name, "inputs": []})
        self.arg_nodes.append(nid)
        self._entries([(shape, dtype)], [sid])
        return nid

    def op(self, func_name, inputs, outs, sids=None, name=None, flatten=0) -> int:
        """``inputs``: node ids or (node id, output index); ``outs``: [(shape, dtype)]."""
        nid = len(self.nodes)
        entries = [[i, 0, 0] if isinstance(i, int) else [i[0], i[1], 0] for i in inputs]
        self.nodes.append({"op": "tvm_op", "name": name or func_name, "inputs": entries,
                           "attrs": {"func_name": func_name, "num_inputs": str(len(inputs)),
                                     "num_outputs": str(len(outs)), "flatten_data": str(flatten)}})
        self._entries(outs, sids or [None] * len(outs))
        return nid

    def json(self, heads) -> str:
        heads = [[h, 0, 0] if isinstance(h, int) else [h[0], h[1], 0] for h in heads]
        return json.dumps({
            "nodes": self.nodes, "arg_nodes": self.arg_nodes, "heads": heads,
            "attrs": {"dltype": ["list_str", self.dltype], "storage_id": ["list_int", self.storage_id],
                      "shape": ["list_shape", self.shape]},
            "node_row_ptr": self.row_ptr,
        })


def seed_graph_json(symbol="subgraph_0") -> str:
    """The graph TVM writes for the seed model fully offloaded: four inputs, one external call."""
    g = GraphBuilder()
    ins = [g.input(f"input{i}", (10, 10)) for i in range(4)]
    out = g.op(symbol, ins, [((10, 10), "float32")])
    return g.json([out])
