"""The module tree a library carries, and the built-in module kinds.

A blob holds a tree (a DAG in general) of modules.  Each node here is one module with its type
key, its imports and the decoded payload.  ``PAYLOADS`` (``node.py``) maps every type key we
understand to the construct declaration of its payload (``formats.py``) and two small functions that
turn the parsed value into a node and back; ``blob.py`` uses it for every layout.  Every kind reaches
it through ``plugins.install``: the built-in ones here (:data:`BUILTIN`), installed plugins when the
board starts (``plugins.load_plugins``).

Type keys (TVM's ``type_key()`` / ``kind()``):

* ``GraphExecutorFactory`` (0.7: ``GraphRuntimeFactory``): graph JSON, params, module name;
* ``examplejson``: its own module kind (``examplejson.py``);
* ``relax.VMExecutable``: its own module kind (``vm_executable.py``);
* ``const_loader`` (0.7-0.8: ``metadata``): named constant arrays and which external symbol needs
  which of them;
* ``tensorrt``, ``arm_compute_lib``, ``dnnl_json``, ``clml``, ``bnns_json``, ``json``: TVM's
  JSON-runtime BYOC modules, their own module kind (``jsonrt.py``, ``jsonrt_inspect.py``);
* ``_lib``: placeholder for the host library itself (the shared object the blob sits in); it has
  no payload, its functions are the library's symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .examplejson import PLUGIN as _EXAMPLEJSON
from .formats import ConstLoaderPayload, GraphExecutorFactoryPayload
from .jsonrt_inspect import PLUGIN as _JSON_RUNTIME
from .node import PAYLOADS, ModuleNode, PayloadCodec, walk_imports  # noqa: F401  (declared in the leaf node.py)
from .plugins import ModuleKind, RuntimePlugin, install
from .vm_executable import PLUGIN as _VM_EXECUTABLE

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

#: TVM's graph executor libraries: the factory and the const loader (their runtimes: rpcsrv.executor.graph.factory,
#: rpcsrv.executor.const_loader; ``rpcsrv inspect`` knows them by class, ``inspect.py``)
GRAPH_EXECUTOR = RuntimePlugin("graph_executor", (
    ModuleKind(("GraphExecutorFactory", "GraphRuntimeFactory"), _FACTORY,
               "rpcsrv.executor.graph.factory:factory_runtime"),
    ModuleKind(("const_loader", "metadata"), _CONSTS, "rpcsrv.executor.const_loader:const_loader_runtime"),
), "TVM's graph executor factory and const loader")

#: the built-in kinds, installed through the plugin interface like any other
BUILTIN = (GRAPH_EXECUTOR, _EXAMPLEJSON, _VM_EXECUTABLE, _JSON_RUNTIME)
for _plugin in BUILTIN:
    install(_plugin)


def require_known(mod: ModuleNode) -> ModuleNode:
    """``mod`` itself, or a ValueError when it is a module we could not decode."""
    if isinstance(mod, UnknownModule):
        raise ValueError(f"module of type key {mod.type_key!r} ({len(mod.payload)} bytes) is not "
                         f"supported by rpcsrv (no installed plugin registers it); known: "
                         f"{', '.join(sorted(PAYLOADS))}")
    return mod
