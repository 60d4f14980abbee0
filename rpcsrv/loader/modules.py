"""The module tree a library carries, and each module type's payload codec.

A blob holds a tree (a DAG in general) of modules.  Each node here is one module with its type
key, its imports and the decoded payload.  ``PAYLOADS`` maps every type key we understand to the
construct declaration of its payload (``formats.py``) and two small functions that turn the parsed
value into a node and back; ``blob.py`` uses it for every layout.

Type keys (TVM's ``type_key()`` / ``kind()``):

* ``GraphExecutorFactory`` (0.7: ``GraphRuntimeFactory``): graph JSON, params, module name;
* ``examplejson``: the ExampleJSON text (``docs/examplejson.md``);
* ``const_loader`` (0.7-0.8: ``metadata``): named constant arrays and which external symbol needs
  which of them;
* ``tensorrt``, ``arm_compute_lib``, ``dnnl_json``, ``clml``, ``bnns_json``, ``json``: TVM's
  JSON-runtime BYOC modules (``jsonrt.py``);
* ``_lib``: placeholder for the host library itself (the shared object the blob sits in); it has
  no payload, its functions are the library's symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .formats import ConstLoaderPayload, ExampleJSONPayload, GraphExecutorFactoryPayload
from .jsonrt import PAYLOADS as _JSON_RUNTIME_PAYLOADS
from .node import ModuleNode, PayloadCodec, walk_imports  # noqa: F401  (declared in the leaf node.py; re-exported)
from .vm_executable import PAYLOAD as _VM_EXECUTABLE

LIB_KEY = "_lib"
IMPORT_TREE_KEY = "_import_tree"


@dataclass(eq=False, repr=False)
class GraphExecutorFactoryModule(ModuleNode):
    """What ``relay.build`` exports: the graph JSON, its params and the module name."""

    graph_json: str
    params: dict[str, np.ndarray]
    module_name: str = "default"
    type_key: str = field(default="GraphExecutorFactory", kw_only=True)


@dataclass(eq=False, repr=False)
class ExampleJSONModule(ModuleNode):
    """A BYOC ExampleJSON module: its subgraphs as one text."""

    code: str
    type_key: str = field(default="examplejson", kw_only=True)


@dataclass(eq=False, repr=False)
class ConstLoaderModule(ModuleNode):
    """Constants for external modules, and the constant names each external symbol needs."""

    arrays: dict[str, np.ndarray]
    const_vars_by_symbol: dict[str, list[str]]
    type_key: str = field(default="const_loader", kw_only=True)


@dataclass(eq=False, repr=False)
class HostLibraryModule(ModuleNode):
    """The host library: the ``_lib`` placeholder of a blob, or (type key ``library``) a library
    with no blob at all.  ``symbols`` are its function symbols; ``path`` is the file (set by
    ``load_library``; None for a tree built in memory), so that the native layer can open it."""

    symbols: list[str] = field(default_factory=list)
    type_key: str = field(default=LIB_KEY, kw_only=True)
    path: str | None = field(default=None, kw_only=True)


@dataclass(eq=False, repr=False)
class UnknownModule(ModuleNode):
    """A module whose type key we cannot decode (tvm-ffi layout only, where it can be skipped).

    Using it must fail: ``require_known`` raises a clear error naming the type key.
    """

    payload: bytes = b""


def _decode_factory(v, key: str) -> ModuleNode:
    if len(set(v.names)) != len(v.names):
        raise ValueError("duplicate parameter names")
    return GraphExecutorFactoryModule(v.graph_json, dict(zip(v.names, v.arrays)), v.module_name,
                                      type_key=key)


def _encode_factory(m: GraphExecutorFactoryModule):
    return dict(graph_json=m.graph_json, names=list(m.params), arrays=list(m.params.values()),
                module_name=m.module_name)


def _decode_consts(v, key: str) -> ModuleNode:
    if len(set(v.names)) != len(v.names) or len(set(v.symbols)) != len(v.symbols):
        raise ValueError("duplicate constant or symbol names")
    return ConstLoaderModule(dict(zip(v.names, v.arrays)),
                             {s: list(c) for s, c in zip(v.symbols, v.const_vars)}, type_key=key)


def _encode_consts(m: ConstLoaderModule):
    return dict(names=list(m.arrays), arrays=list(m.arrays.values()),
                symbols=list(m.const_vars_by_symbol),
                const_vars=[list(v) for v in m.const_vars_by_symbol.values()])


_FACTORY = PayloadCodec(GraphExecutorFactoryPayload, _decode_factory, _encode_factory)
_CONSTS = PayloadCodec(ConstLoaderPayload, _decode_consts, _encode_consts)

PAYLOADS: dict[str, PayloadCodec] = {
    "GraphExecutorFactory": _FACTORY,
    "GraphRuntimeFactory": _FACTORY,
    "examplejson": PayloadCodec(ExampleJSONPayload,
                                lambda v, key: ExampleJSONModule(v, type_key=key), lambda m: m.code),
    "const_loader": _CONSTS,
    "metadata": _CONSTS,
}

PAYLOADS["relax.VMExecutable"] = _VM_EXECUTABLE
PAYLOADS.update(_JSON_RUNTIME_PAYLOADS)  # TVM's JSON-runtime BYOC kinds (tensorrt, arm_compute_lib, ...): jsonrt.py


def require_known(mod: ModuleNode) -> ModuleNode:
    """``mod`` itself, or a ValueError when it is a module we could not decode."""
    if isinstance(mod, UnknownModule):
        raise ValueError(f"module of type key {mod.type_key!r} ({len(mod.payload)} bytes) is not "
                         f"supported by rpcsrv; known: {', '.join(sorted(PAYLOADS))}")
    return mod
