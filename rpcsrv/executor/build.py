"""Building the runtime modules of a loaded module tree: :func:`build_runtime`, :func:`load_module`.

``load_module(path)`` is what ``tvm.rpc.server.load_module`` does on this board: parse the
library without loading it (``rpcsrv.loader``), then :func:`build_runtime` makes a runtime module
for each node of the module tree, keeping the import structure, and checks everything that can
be checked before any data arrives (graph JSON, ExampleJSON text and ops, constants).

Module kinds: plugins, one walk
-------------------------------
Each node's runtime module comes from its kind (``rpcsrv.loader.plugins``: ``ModuleKind.runtime``,
``factory(node, imports, options) -> RuntimeModule``), installed as a plugin: the built-in kinds
(graph executor factory: ``graph/factory.py``; const loader: ``const_loader.py``; ExampleJSON:
``examplejson/subgraphs.py``; the Relax VM: ``vm/``) and those of installed packages (entry-point group
``rpcsrv.runtimes``).  Two nodes are not payload kinds and stay in ``RUNTIME_KINDS`` (by node class, and
its bases):

==========================  =================================================================
HostLibraryModule           ``options.host_library(node, imports)``: native functions by symbol
                            (``rpcsrv.native``), or by default ``HostLibraryRuntime``, which
                            lists the symbols and refuses to run them
UnknownModule (any other)   ``OpaqueRuntime`` (kept in the tree, exports nothing)
==========================  =================================================================

``register_runtime(NodeClass, factory)`` still adds a kind by node class (code written before the
plugin interface).  ``build_runtime`` converts the tree once, imports first, each node once (a DAG
stays a DAG), then links constants through the modules' own hooks (``RuntimeModule.bind_constants``,
``bind_params``, ``check_constants``): no kind is special here.  Lookup is TVM's everywhere:
``RuntimeModule.find_function`` asks the module itself, then its imports depth-first
(``rpcsrv.loader.modules.walk_imports``, the one walk shared by loader nodes and runtime modules).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ..loader.modules import HostLibraryModule, ModuleNode
from ..loader.plugins import kind_of
from .const_loader import ConstLoaderRuntime
from .graph.factory import GraphExecutorFactoryRuntime
from .memory import tune_allocator
from .module import ExecutorError, RuntimeModule
from .placeholders import HostLibraryRuntime, OpaqueRuntime


def _placeholder_library(node: HostLibraryModule, imports: list[RuntimeModule]) -> RuntimeModule:
    return HostLibraryRuntime(list(node.symbols), imports, node.type_key)


@dataclass
class BuildOptions:
    """How the nodes that depend on the board's policy are built.

    ``host_library(node, imports)`` makes the runtime module of a host library (native code);
    the default lists its symbols and refuses to run them (``rpcsrv serve --no-native``).
    """

    host_library: Callable[[HostLibraryModule, list[RuntimeModule]], RuntimeModule] = _placeholder_library


RuntimeFactory = Callable[[Any, list[RuntimeModule], BuildOptions], RuntimeModule]

RUNTIME_KINDS: dict[type, RuntimeFactory] = {
    HostLibraryModule: lambda n, imports, o: o.host_library(n, imports),
    ModuleNode: lambda n, imports, _o: OpaqueRuntime(n.type_key, imports),  # UnknownModule and the rest
}


def register_runtime(node_class: type, factory: RuntimeFactory) -> None:
    """Add a module kind: loader nodes of ``node_class`` become ``factory(node, imports, options)``."""
    RUNTIME_KINDS[node_class] = factory


_RESOLVED: dict[str, RuntimeFactory] = {}


def _resolve(ref: str) -> RuntimeFactory:
    """A plugin's ``"module:attribute"`` runtime factory, imported once."""
    if ref not in _RESOLVED:
        module, _, attr = ref.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ExecutorError(f"runtime factory {ref!r} cannot be imported: {exc}") from None
        _RESOLVED[ref] = factory
    return _RESOLVED[ref]


def _factory(node: Any) -> RuntimeFactory:
    kind = kind_of(node)
    if kind is not None:
        return _resolve(kind.runtime) if isinstance(kind.runtime, str) else kind.runtime
    for cls in type(node).__mro__:
        factory = RUNTIME_KINDS.get(cls)
        if factory is not None:
            if cls is ModuleNode and type(node).__name__ != "UnknownModule":  # decoded, but nothing runs it
                raise ExecutorError(f"module of type key {node.type_key!r}: this board has no runtime for it "
                                    f"(no installed plugin registers it)")
            return factory
    raise ExecutorError(f"{type(node).__name__} is not a module of the loader's tree")


def build_runtime(root: Any, options: BuildOptions | None = None) -> RuntimeModule:
    """Runtime modules for the loader's module tree rooted at ``root``; returns the root's.

    Constants of external modules are bound here: first from a const loader that imports the
    module, then from the params of a graph executor factory above it (each module's
    ``bind_constants`` / ``bind_params``).  A constant left unbound is an error now
    (``check_constants``), not at ``run``.  The allocator is tuned for the kernels' large temporaries
    first (:func:`rpcsrv.executor.memory.tune_allocator`, once per process).
    """
    tune_allocator()
    options = options or BuildOptions()
    built: dict[int, RuntimeModule] = {}

    def convert(node: Any, depth: int) -> RuntimeModule:
        if id(node) in built:
            return built[id(node)]
        if depth > 64:
            raise ExecutorError("the module import tree is too deep (a cycle?)")
        imports = [convert(child, depth + 1) for child in node.imports]
        built[id(node)] = mod = _factory(node)(node, imports, options)
        return mod

    top = convert(root, 0)
    _bind_constants(list(top.walk()))
    return top


def _bind_constants(modules: list[RuntimeModule]) -> None:
    for mod in modules:
        if isinstance(mod, ConstLoaderRuntime):
            mod.bind_imports()
    for mod in modules:
        if isinstance(mod, GraphExecutorFactoryRuntime):
            for sub in mod.walk():
                sub.bind_params(mod.params, "the graph params")
    for mod in modules:
        mod.check_constants()


def load_module(path: str, options: BuildOptions | None = None) -> RuntimeModule:
    """Load an exported library (``.so``, object, raw blob) and build its runtime modules."""
    from ..loader import load_library  # the loader is only needed for files

    return build_runtime(load_library(path).root, options)
