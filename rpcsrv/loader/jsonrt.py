"""TVM's JSON-runtime BYOC modules (``JSONRuntimeBase``): the payload and the loader node.

TensorRT (``tensorrt``), Arm Compute Library (``arm_compute_lib``), DNNL (``dnnl_json``), CLML
(``clml``), BNNS (``bnns_json``) and the plain ``json`` key all serialize the same three dmlc fields
(TVM v0.19.0 ``src/runtime/contrib/json/json_runtime.h``, ``SaveToBinary``):

* the symbol: the one external function this module provides (string);
* the graph JSON (string; ``jsonrt_graph.py`` reads it);
* the names of its constants (vector of strings), in the order of the graph's ``const`` nodes.  The
  arrays themselves sit in the library's const loader (``metadata`` before 0.9), keyed by these names.

``CODEC`` serves each of these type keys; ``jsonrt_inspect.PLUGIN`` declares the kind (a built-in
plugin).  Decoding checks the graph (:meth:`JSONRuntimeModule.graph`), so a library with a broken graph
is refused when it is loaded, with the node named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from construct import Struct

from .formats import DmlcString, StringVector
from .jsonrt_graph import JSONGraph, JSONGraphError, parse_json_graph
from .node import ModuleNode, PayloadCodec

#: every type key whose payload is JSONRuntimeBase's, with the backend it belongs to
JSON_RUNTIME_KEYS = {
    "tensorrt": "TensorRT",
    "arm_compute_lib": "Arm Compute Library",
    "dnnl_json": "DNNL (oneDNN)",
    "clml": "OpenCL ML (CLML)",
    "bnns_json": "Apple BNNS",
    "json": "the generic JSON runtime",
}

JSONRuntimePayload = Struct(
    "symbol" / DmlcString,
    "graph_json" / DmlcString,
    "const_names" / StringVector,
)


@dataclass(eq=False, repr=False)
class JSONRuntimeModule(ModuleNode):
    """One JSON-runtime module: its symbol, its graph JSON and its constant names."""

    symbol: str
    graph_json: str
    const_names: list[str] = field(default_factory=list)
    type_key: str = field(default="json", kw_only=True)

    @cached_property
    def graph(self) -> JSONGraph:
        """The parsed graph, checked against the constant names (TVM's ``LoadGraph`` rules):
        the ``const`` nodes, in ``arg_nodes`` order, are exactly ``const_names``."""
        try:
            graph = parse_json_graph(self.graph_json)
        except JSONGraphError as exc:
            raise JSONGraphError(f"{self.type_key} module {self.symbol!r}: {exc}") from None
        names = [graph.nodes[n].name for n in graph.const_nodes]
        if names != list(self.const_names):
            raise JSONGraphError(f"{self.type_key} module {self.symbol!r}: the graph's const nodes are "
                                 f"{names[:8]} but the module lists constants {list(self.const_names)[:8]} "
                                 "(same names in the same order expected)")
        if len(set(names)) != len(names):
            raise JSONGraphError(f"{self.type_key} module {self.symbol!r}: duplicate constant names")
        return graph

    def __repr__(self) -> str:
        return f"<JSONRuntimeModule {self.type_key!r} {self.symbol!r} imports={len(self.imports)}>"


def _decode(v, key: str) -> JSONRuntimeModule:
    mod = JSONRuntimeModule(v.symbol, v.graph_json, list(v.const_names), type_key=key)
    mod.graph  # noqa: B018  (checked now: a broken graph is refused when the library loads)
    return mod


def _encode(m: JSONRuntimeModule):
    return dict(symbol=m.symbol, graph_json=m.graph_json, const_names=list(m.const_names))


CODEC = PayloadCodec(JSONRuntimePayload, _decode, _encode)

