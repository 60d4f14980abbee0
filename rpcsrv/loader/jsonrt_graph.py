"""The graph JSON of TVM's JSON-runtime BYOC modules (``JSONRuntimeBase``): parse, check, write.

TVM's ``JSONSerializer`` (relay ``codegen_json``) writes one object per external function:

* ``nodes``: each ``{"op": "input" | "const" | "kernel", "name": ..., "inputs": [[node, index,
  version], ...], "attrs": {...}}``.  An ``input`` is a function parameter (its name is the
  parameter's), a ``const`` a constant bound later by name, a ``kernel`` one operator call: its
  name is the relay op (``nn.conv2d``, ``add``) or the backend's composite (``dnnl.conv2d_bias_relu``,
  ``tensorrt.nn.dense``).
* ``attrs``: ``shape`` is ``[[shape, ...]]`` and ``dtype`` ``[["float32", ...]]`` (one per output),
  ``num_inputs`` / ``num_outputs`` plain strings, every other attribute a list of strings wrapped
  in a one-element list (``"strides": [["1", "1"]]``).
* ``arg_nodes``: the leaves (inputs and constants) in node order; ``heads``: the outputs as
  ``[node, index, version]``; ``node_row_ptr``: the first data-entry index of each node (prefix sums
  of the output counts); ``symbol``: the function name (optional).

:func:`parse_json_graph` checks everything the runtime relies on (nodes in topological order,
entries in range, row pointers, shape/dtype counts) and raises :class:`JSONGraphError` naming the
node; :func:`dump_json_graph` writes the same layout back, and :class:`GraphBuilder` makes graphs
for tests and tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..protocol.dtypes import DataType

NODE_OPS = ("input", "const", "kernel")
_GRAPH_KEYS = {"nodes", "arg_nodes", "heads", "node_row_ptr", "symbol"}
_NODE_KEYS = {"op", "name", "inputs", "attrs", "attr"}
#: attributes every node carries that are not the op's own
STRUCTURAL_ATTRS = ("shape", "dtype", "num_inputs", "num_outputs")


class JSONGraphError(ValueError):
    """A JSON-runtime graph that breaks the format; the message names the node."""


@dataclass(frozen=True)
class Entry:
    """One output of one node: ``[node, index, version]``."""

    node: int
    index: int = 0
    version: int = 0


@dataclass
class JSONNode:
    """One node: its op kind, name (the kernel name for ``kernel``), inputs, output types and attrs."""

    op: str
    name: str
    inputs: list[Entry] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    attrs: dict[str, list[str]] = field(default_factory=dict)

    @property
    def num_outputs(self) -> int:
        return len(self.shapes)

    def attr(self, key: str, default: Any = None) -> Any:
        """The attribute's string list, or ``default``."""
        return self.attrs.get(key, default)


@dataclass
class JSONGraph:
    """A checked JSON-runtime graph."""

    nodes: list[JSONNode]
    arg_nodes: list[int]
    heads: list[Entry]
    node_row_ptr: list[int]
    symbol: str | None = None

    def entry_id(self, e: Entry) -> int:
        return self.node_row_ptr[e.node] + e.index

    @property
    def input_entries(self) -> list[Entry]:
        """The function's tensor arguments, in order (every output of every ``input`` node)."""
        return [Entry(n, i) for n in self.arg_nodes if self.nodes[n].op == "input"
                for i in range(self.nodes[n].num_outputs)]

    @property
    def const_nodes(self) -> list[int]:
        """The ``const`` nodes in ``arg_nodes`` order (the order of the module's constant names)."""
        return [n for n in self.arg_nodes if self.nodes[n].op == "const"]


def _fail(where: str, message: str):
    raise JSONGraphError(f"{where}: {message}")


def _int(value: Any, where: str, what: str) -> int:
    if type(value) is not int:
        _fail(where, f"{what} must be an integer, got {value!r}")
    return value


def _strings(value: Any, where: str, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        _fail(where, f"{what} must be a list of strings, got {str(value)[:80]}")
    return value


def _wrapped(value: Any, where: str, key: str) -> Any:
    """The one element of an ``[[...]]`` attribute."""
    if not isinstance(value, list) or len(value) != 1:
        _fail(where, f"attribute {key!r} must be a one-element list wrapping its value, got {str(value)[:80]}")
    return value[0]


def _entry(value: Any, where: str) -> Entry:
    if not isinstance(value, list) or not 2 <= len(value) <= 3:
        _fail(where, f"an input entry must be [node, index] or [node, index, version], got {str(value)[:60]}")
    ints = [_int(v, where, "an entry field") for v in value]
    if min(ints) < 0:
        _fail(where, f"entry {ints} has a negative field")
    return Entry(*ints)


def _attrs(raw: Any, where: str) -> tuple[list, list[str], dict[str, list[str]], dict[str, int]]:
    if not isinstance(raw, dict):
        _fail(where, "attrs must be an object")
    shapes, dtypes, attrs, counts = [], [], {}, {}
    for key, value in raw.items():
        if key in ("num_inputs", "num_outputs"):
            if not isinstance(value, str) or not value.isdigit():
                _fail(where, f"{key} must be a string of digits, got {value!r}")
            counts[key] = int(value)
        elif key == "shape":
            shapes = _wrapped(value, where, key)
            if not isinstance(shapes, list):
                _fail(where, "shape must be a list of shapes")
            for s in shapes:
                if not isinstance(s, list) or any(type(d) is not int or d < 0 for d in s):
                    _fail(where, f"shape {str(s)[:60]} is not a list of non-negative integers")
        elif key == "dtype":
            dtypes = _strings(_wrapped(value, where, key), where, "dtype")
            for d in dtypes:
                try:
                    ok = DataType.parse(d).bits in (1, 4, 8, 16, 32, 64, 128)
                except ValueError:
                    ok = False
                if not ok:
                    _fail(where, f"unknown dtype {d!r}")
        else:
            attrs[key] = _strings(_wrapped(value, where, key), where, f"attribute {key!r}")
    if len(shapes) != len(dtypes):
        _fail(where, f"{len(shapes)} shape(s) but {len(dtypes)} dtype(s)")
    return [tuple(s) for s in shapes], dtypes, attrs, counts


def _node(raw: Any, nid: int) -> tuple[JSONNode, dict[str, int]]:
    where = f"node {nid}"
    if not isinstance(raw, dict):
        _fail(where, "must be an object")
    unknown = set(raw) - _NODE_KEYS
    if unknown:
        _fail(where, f"unknown key(s) {sorted(unknown)}")
    op, name = raw.get("op"), raw.get("name")
    if op not in NODE_OPS:
        _fail(where, f"op must be one of {', '.join(NODE_OPS)}, got {op!r}")
    if not isinstance(name, str):
        _fail(where, f"name must be a string, got {name!r}")
    where = f"node {nid} ({op} {name!r})"
    inputs = raw.get("inputs", [])
    if not isinstance(inputs, list):
        _fail(where, "inputs must be a list")
    shapes, dtypes, attrs, counts = _attrs(raw.get("attrs", raw.get("attr", {})), where)
    return JSONNode(op, name, [_entry(e, where) for e in inputs], shapes, dtypes, attrs), counts


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list):
        _fail("graph", f"{what} must be a list")
    return [_int(v, "graph", f"an element of {what}") for v in value]


def parse_json_graph(text: str) -> JSONGraph:
    """Parse and check a JSON-runtime graph; raises :class:`JSONGraphError` with the node named."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise JSONGraphError(f"graph JSON does not parse: {exc}") from None
    if not isinstance(raw, dict):
        _fail("graph", "must be a JSON object")
    unknown = set(raw) - _GRAPH_KEYS
    if unknown:
        _fail("graph", f"unknown key(s) {sorted(unknown)}")
    for key in ("nodes", "arg_nodes", "heads", "node_row_ptr"):
        if key not in raw:
            _fail("graph", f"missing {key!r}")
    if not isinstance(raw["nodes"], list) or not raw["nodes"]:
        _fail("graph", "nodes must be a non-empty list")
    nodes = []
    for nid, item in enumerate(raw["nodes"]):
        node, counts = _node(item, nid)
        where = f"node {nid} ({node.op} {node.name!r})"
        if node.op == "kernel":
            if not node.inputs:
                _fail(where, "a kernel has no inputs")
            if not node.shapes:
                _fail(where, "a kernel declares no output shape/dtype")
        elif node.inputs:
            _fail(where, f"an {node.op} node takes no inputs")
        elif not node.shapes or (node.op == "const" and len(node.shapes) != 1):
            _fail(where, f"{'a const' if node.op == 'const' else 'an input'} needs "
                         f"{'one' if node.op == 'const' else 'at least one'} shape and dtype")
        if counts.get("num_inputs", len(node.inputs)) != len(node.inputs):
            _fail(where, f"num_inputs is {counts['num_inputs']} but it has {len(node.inputs)} input(s)")
        if node.op == "kernel" and counts.get("num_outputs", 1) != node.num_outputs:
            _fail(where, f"num_outputs is {counts.get('num_outputs', 1)} but it declares "
                         f"{node.num_outputs} shape(s)")
        for e in node.inputs:
            if e.node >= nid:
                _fail(where, f"input [{e.node}, {e.index}] is not an earlier node (nodes must be in "
                             "topological order)")
            if e.index >= nodes[e.node].num_outputs:
                _fail(where, f"input [{e.node}, {e.index}]: node {e.node} has {nodes[e.node].num_outputs} output(s)")
        nodes.append(node)
    arg_nodes = _int_list(raw["arg_nodes"], "arg_nodes")
    leaves = [i for i, n in enumerate(nodes) if n.op != "kernel"]
    if sorted(arg_nodes) != leaves or len(set(arg_nodes)) != len(arg_nodes):
        _fail("graph", f"arg_nodes {arg_nodes[:16]} must list each input and const node once "
                       f"(they are {leaves[:16]})")
    row_ptr = _int_list(raw["node_row_ptr"], "node_row_ptr")
    want = [0]
    for n in nodes:
        want.append(want[-1] + n.num_outputs)
    if row_ptr != want:
        _fail("graph", f"node_row_ptr {row_ptr[:16]} does not match the nodes' output counts "
                       f"(expected {want[:16]})")
    if not isinstance(raw["heads"], list) or not raw["heads"]:
        _fail("graph", "heads must be a non-empty list")
    heads = [_entry(h, "heads") for h in raw["heads"]]
    for h in heads:
        if h.node >= len(nodes) or h.index >= nodes[h.node].num_outputs:
            _fail("heads", f"output [{h.node}, {h.index}] is not an output of a node")
    symbol = raw.get("symbol")
    if symbol is not None and not isinstance(symbol, str):
        _fail("graph", "symbol must be a string")
    return JSONGraph(nodes, arg_nodes, heads, row_ptr, symbol)


def _node_json(node: JSONNode) -> dict:
    attrs: dict[str, Any] = {"shape": [[list(s) for s in node.shapes]], "dtype": [list(node.dtypes)]}
    out: dict[str, Any] = {"op": node.op, "name": node.name}
    if node.inputs:
        attrs["num_inputs"] = str(len(node.inputs))
        attrs["num_outputs"] = str(node.num_outputs)
        out["inputs"] = [[e.node, e.index, e.version] for e in node.inputs]
    attrs.update({k: [list(v)] for k, v in node.attrs.items()})
    out["attrs"] = attrs
    return out


def dump_json_graph(graph: JSONGraph) -> str:
    """The graph as TVM's serializer lays it out (parses back to an equal graph)."""
    doc: dict[str, Any] = {} if graph.symbol is None else {"symbol": graph.symbol}
    doc.update(nodes=[_node_json(n) for n in graph.nodes], arg_nodes=list(graph.arg_nodes),
               heads=[[h.node, h.index, h.version] for h in graph.heads], node_row_ptr=list(graph.node_row_ptr))
    return json.dumps(doc, indent=1)


def _attr_strings(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(int(value)) if isinstance(value, bool) else str(value)]


class GraphBuilder:
    """Build a graph node by node (for tests and tools): ``b.input(...)``, ``b.const(...)`` and
    ``b.kernel(...)`` return the new node's first entry; ``b.graph(heads)`` the finished graph."""

    def __init__(self, symbol: str | None = None):
        self.symbol = symbol
        self.nodes: list[JSONNode] = []

    def _add(self, node: JSONNode) -> Entry:
        self.nodes.append(node)
        return Entry(len(self.nodes) - 1)

    def input(self, name: str, shape: Iterable[int], dtype: str = "float32") -> Entry:
        return self._add(JSONNode("input", name, shapes=[tuple(shape)], dtypes=[dtype]))

    def const(self, name: str, shape: Iterable[int], dtype: str = "float32") -> Entry:
        return self._add(JSONNode("const", name, shapes=[tuple(shape)], dtypes=[dtype]))

    def kernel(self, name: str, inputs: list[Entry], shape: Iterable[int], dtype: str = "float32",
               **attrs: Any) -> Entry:
        """A kernel node; attribute values become string lists (``strides=[1, 1]`` -> ``["1", "1"]``)."""
        return self._add(JSONNode("kernel", name, list(inputs), [tuple(shape)], [dtype],
                                  {k: _attr_strings(v) for k, v in attrs.items()}))

    def graph(self, heads: list[Entry]) -> JSONGraph:
        row = [0]
        for n in self.nodes:
            row.append(row[-1] + n.num_outputs)
        return JSONGraph(list(self.nodes), [i for i, n in enumerate(self.nodes) if n.op != "kernel"],
                         list(heads), row, self.symbol)

    def const_names(self) -> list[str]:
        return [n.name for n in self.nodes if n.op == "const"]
