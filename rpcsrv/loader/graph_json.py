"""Graph JSON as TVM's graph executor codegen writes it, parsed and checked up front.

The layout (TVM v0.19 ``graph_executor.h``): ``nodes`` (each ``op`` = ``null`` for graph inputs and
params or ``tvm_op`` for a call, ``name``, ``inputs`` as ``[node_id, index(, version)]``, and for
``tvm_op`` the string attrs ``func_name``, ``num_inputs``, ``num_outputs``, ``flatten_data``),
``arg_nodes`` (the input node ids), ``heads`` (output entries), ``node_row_ptr`` (the first entry id of
each node; entry ids number every node output) and ``attrs`` with per-entry ``storage_id``,
``shape``, ``dltype`` (each as ``["list_int"|"list_shape"|"list_str", values]``) and optional
``device_index``/``storage_scope``; ``metadata`` (optional) may name the outputs (``output_names``).  A graph
TVM would reject is rejected here with a message that says which field is wrong.

The one reader of graph JSON: the graph executor runs what it returns, ``rpcsrv inspect`` summarizes it, and
the board's native-code policy asks which functions it calls (``rpcsrv.native.host``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..protocol.dtypes import numpy_dtype
from .errors import LoaderError

_TOP_KEYS = {"nodes", "arg_nodes", "node_row_ptr", "heads", "attrs"}
_ATTR_TYPES = {"storage_id": "list_int", "shape": "list_shape", "dltype": "list_str",
               "device_index": "list_int", "storage_scope": "list_str"}
_OP_PARAMS = ("func_name", "num_inputs", "num_outputs", "flatten_data")


class GraphJSONError(LoaderError):
    """A graph JSON the executor cannot run."""


@dataclass
class GraphNode:
    op: str  # "null" or "tvm_op"
    name: str
    inputs: list[tuple[int, int]]
    func_name: str = ""
    num_inputs: int = 0
    num_outputs: int = 1
    flatten_data: bool = False
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class Graph:
    nodes: list[GraphNode]
    arg_nodes: list[int]
    heads: list[tuple[int, int]]
    node_row_ptr: list[int]
    storage_id: list[int]
    shape: list[tuple[int, ...]]
    dltype: list[str]
    dtypes: list[np.dtype]
    device_index: list[int]
    metadata: dict = field(default_factory=dict)

    def entry_id(self, node_id: int, index: int = 0) -> int:
        return self.node_row_ptr[node_id] + index

    @property
    def num_entries(self) -> int:
        return self.node_row_ptr[-1]

    def called(self) -> set[str]:
        """The functions the graph's ``tvm_op`` nodes call (``__nop`` and ``__copy`` are the executor's own)."""
        return {n.func_name for n in self.nodes if n.op == "tvm_op" and n.func_name not in ("__nop", "__copy")}

    def output_names(self) -> list[str]:
        """The outputs' names the model kept (``metadata.output_names``), or none."""
        names = self.metadata.get("output_names") or []
        ok = len(names) == len(self.heads) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)
        return list(names) if ok else []


def _fail(msg: str):
    raise GraphJSONError(f"graph JSON: {msg}")


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        _fail(f"{what} must be a list of integers")
    return value


def _entry(value: Any, what: str, num_nodes: int) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) not in (2, 3)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        _fail(f"{what} must be [node_id, index] or [node_id, index, version], got {value!r}")
    if not 0 <= value[0] < num_nodes or value[1] < 0:
        _fail(f"{what} refers to node {value[0]} output {value[1]}, which does not exist")
    return value[0], value[1]


def _op_param(attrs: dict, key: str, where: str) -> int:
    value = attrs[key]
    try:
        return int(value)  # TVM writes these as strings ("3"); accept plain numbers as well
    except (TypeError, ValueError):
        _fail(f"{where}: attribute {key!r} must be an integer, got {value!r}")


def _node(raw: Any, nid: int, num_nodes: int) -> GraphNode:
    where = f"node {nid}"
    if not isinstance(raw, dict):
        _fail(f"{where} must be an object")
    for key in raw:
        if key not in ("op", "name", "inputs", "attr", "attrs", "control_deps"):
            _fail(f"{where}: key {key!r} is not supported")
    for key in ("op", "name", "inputs"):
        if key not in raw:
            _fail(f"{where}: missing {key!r}")
    op, name = raw["op"], raw["name"]
    if op not in ("null", "tvm_op"):
        _fail(f"{where} ({name!r}): op {op!r} is not supported (only 'null' and 'tvm_op')")
    if not isinstance(raw["inputs"], list):
        _fail(f"{where}: inputs must be a list")
    inputs = [_entry(e, f"{where} input {k}", num_nodes) for k, e in enumerate(raw["inputs"])]
    if any(src >= nid for src, _ in inputs):
        _fail(f"{where} ({name!r}) uses a node that comes after it (nodes must be in execution order)")
    attrs = raw.get("attrs", raw.get("attr", {}))
    if not isinstance(attrs, dict):
        _fail(f"{where}: attrs must be an object")
    node = GraphNode(op, str(name), inputs, attrs={k: v for k, v in attrs.items() if k not in _OP_PARAMS})
    if op == "tvm_op":
        missing = [k for k in _OP_PARAMS if k not in attrs]
        if missing:
            _fail(f"{where} ({name!r}): tvm_op attrs lack {', '.join(missing)}")
        node.func_name = str(attrs["func_name"])
        node.num_inputs = _op_param(attrs, "num_inputs", where)
        node.num_outputs = _op_param(attrs, "num_outputs", where)
        node.flatten_data = bool(_op_param(attrs, "flatten_data", where))
    return node


def _graph_attr(attrs: dict, key: str, required: bool) -> list:
    if key not in attrs:
        if required:
            _fail(f"attrs lack {key!r}")
        return []
    value = attrs[key]
    if not (isinstance(value, list) and len(value) == 2 and value[0] == _ATTR_TYPES[key]):
        _fail(f"attrs[{key!r}] must be [{_ATTR_TYPES[key]!r}, values]")
    return value[1]


def parse_graph_json(text: str | bytes) -> Graph:
    """Parse and check a graph JSON text."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        _fail(f"not valid JSON ({exc})")
    if not isinstance(doc, dict):
        _fail("the top level must be an object")
    for key in doc:
        if key not in _TOP_KEYS and key != "metadata":
            _fail(f"key {key!r} is not supported")
    missing = sorted(_TOP_KEYS - doc.keys())
    if missing:
        _fail(f"missing {', '.join(missing)}")
    if not isinstance(doc["nodes"], list) or not doc["nodes"]:
        _fail("nodes must be a non-empty list")
    num_nodes = len(doc["nodes"])
    nodes = [_node(raw, nid, num_nodes) for nid, raw in enumerate(doc["nodes"])]
    row_ptr = _int_list(doc["node_row_ptr"], "node_row_ptr")
    if len(row_ptr) != num_nodes + 1 or row_ptr[0] != 0:
        _fail(f"node_row_ptr must have {num_nodes + 1} entries starting at 0, has {len(row_ptr)}")
    for nid, node in enumerate(nodes):
        width = row_ptr[nid + 1] - row_ptr[nid]
        expected = 1 if node.op == "null" else node.num_outputs
        if width != expected:
            _fail(f"node {nid} ({node.name!r}) has {expected} output(s) but node_row_ptr gives it {width}")
        for k, (src, idx) in enumerate(node.inputs):
            if idx >= row_ptr[src + 1] - row_ptr[src]:
                _fail(f"node {nid} input {k} refers to output {idx} of node {src}, which has fewer")
    arg_nodes = _int_list(doc["arg_nodes"], "arg_nodes")
    for nid in arg_nodes:
        if not 0 <= nid < num_nodes or nodes[nid].op != "null":
            _fail(f"arg_nodes lists {nid}, which is not an input ('null') node")
    if not isinstance(doc["heads"], list):
        _fail("heads must be a list")
    heads = [_entry(h, f"heads[{k}]", num_nodes) for k, h in enumerate(doc["heads"])]
    if not isinstance(doc["attrs"], dict):
        _fail("attrs must be an object")
    attrs = doc["attrs"]
    n = row_ptr[-1]
    storage_id = _int_list(_graph_attr(attrs, "storage_id", True), "storage_id")
    shapes = _graph_attr(attrs, "shape", True)
    dltype = _graph_attr(attrs, "dltype", True)
    device_index = _int_list(_graph_attr(attrs, "device_index", False), "device_index")
    for key, values in (("storage_id", storage_id), ("shape", shapes), ("dltype", dltype)):
        if len(values) != n:
            _fail(f"attrs[{key!r}] has {len(values)} entries, the graph has {n} node entries")
    if device_index and len(device_index) != n:
        _fail(f"attrs['device_index'] has {len(device_index)} entries, the graph has {n}")
    if any(s < 0 for s in storage_id):
        _fail("storage_id values must be >= 0")
    shape = []
    for eid, s in enumerate(shapes):
        if not isinstance(s, list) or not all(isinstance(d, int) and d >= 0 for d in s):
            _fail(f"attrs['shape'][{eid}] must be a list of non-negative integers, got {s!r}")
        shape.append(tuple(s))
    dtypes = []
    for eid, d in enumerate(dltype):
        try:
            dtypes.append(numpy_dtype(d))
        except (ValueError, TypeError) as exc:
            _fail(f"attrs['dltype'][{eid}] {d!r}: {exc}")
    metadata = doc.get("metadata")
    return Graph(nodes, arg_nodes, heads, row_ptr, storage_id, shape, list(dltype), dtypes, device_index,
                 metadata if isinstance(metadata, dict) else {})
