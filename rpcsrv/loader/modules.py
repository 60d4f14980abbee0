"""The module tree a library carries, and the built-in module kinds.

A blob holds a tree (a DAG in general) of modules.  Each node here is one module with its type
key, its imports and the decoded payload.  The registry of kinds (``node.py``) maps every type key we
understand to its kind: the construct declaration of its payload (``formats.py``) and two small functions
that turn the parsed value into a node and back, which ``blob.py`` reads for every layout (``PAYLOADS``),
the runtime factory and what ``inspect`` says.  Every kind reaches it through ``plugins.install``: the
built-in ones here (:data:`BUILTIN`; their runtimes are the executor's, which attaches them), installed
plugins when the board starts (``plugins.load_plugins``).

Type keys (TVM's ``type_key()`` / ``kind()``):

* ``GraphExecutorFactory`` (0.7: ``GraphRuntimeFactory``): graph JSON, params, module name;
* ``examplejson``: its own module kind (``examplejson.py``);
* ``relax.VMExecutable``: its own module kind (``vm_executable.py``);
* ``const_loader`` (0.7-0.8: ``metadata``): named constant arrays and which external symbol needs
  which of them;
* ``tensorrt``, ``arm_compute_lib``, ``dnnl_json``, ``clml``, ``bnns_json``, ``json``: TVM's
  JSON-runtime BYOC modules, their own module kind (``jsonrt.py``, ``jsonrt_inspect.py``);
* ``_lib``: placeholder for the host library itself (the shared object the blob sits in); it has
  no payload, its functions are the library's symbols (type key ``library``: a host library with no blob
  at all).  A kind like any other (:data:`HOST_LIBRARY`), without a codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .examplejson import PLUGIN as _EXAMPLEJSON
from .formats import ConstLoaderPayload, GraphExecutorFactoryPayload
from .jsonrt_inspect import PLUGIN as _JSON_RUNTIME
from .node import PAYLOADS, ModuleNode, PayloadCodec, UnknownModule, walk_imports  # noqa: F401  (declared in the leaf)
from .plugins import ModuleKind, RuntimePlugin, install, refusal
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

#: TVM's graph executor libraries: the factory and the const loader (their runtimes, attached by the executor:
#: rpcsrv.executor.graph.factory, rpcsrv.executor.const_loader; ``rpcsrv inspect`` knows them by class, ``inspect.py``)
FACTORY = ModuleKind(("GraphExecutorFactory", "GraphRuntimeFactory"), _FACTORY)
CONST_LOADER = ModuleKind(("const_loader", "metadata"), _CONSTS)
GRAPH_EXECUTOR = RuntimePlugin("graph_executor", (FACTORY, CONST_LOADER),
                               "TVM's graph executor factory and const loader")
#: the host library (no payload: the blob's ``_lib`` entry, or a library without a blob); its runtime, attached by
#: the executor, runs native code as the board's policy says (``BuildOptions.host_library``)
HOST_LIBRARY = ModuleKind((LIB_KEY, "library"), None)
HOST = RuntimePlugin("host_library", (HOST_LIBRARY,), "the host library a blob sits in (its native functions)")

#: the built-in kinds, installed through the plugin interface like any other
BUILTIN = (GRAPH_EXECUTOR, _EXAMPLEJSON, _VM_EXECUTABLE, _JSON_RUNTIME, HOST)
for _plugin in BUILTIN:
    install(_plugin)


def require_known(mod: ModuleNode) -> ModuleNode:
    """``mod`` itself, or a ValueError naming its type key when it is a module we could not decode."""
    if isinstance(mod, UnknownModule):
        raise ValueError(f"{refusal(mod.type_key)} ({len(mod.payload)} bytes)")
    return mod
