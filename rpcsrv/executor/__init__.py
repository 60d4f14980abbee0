"""The board's executor: turns a loaded module tree into runtime modules and runs graphs.

``load_module(path)`` is what ``tvm.rpc.server.load_module`` does on this board: parse the
library without loading it (``rpcsrv.loader``), then :func:`build_runtime` makes a runtime module
for each node of the module tree, keeping the import structure, and checks everything that can
be checked before any data arrives (graph JSON, ExampleJSON text and ops, constants).

Module kinds: one table, one walk
---------------------------------
``RUNTIME_KINDS`` maps each loader payload class (``rpcsrv.loader.modules``) to a factory
``factory(node, imports, options) -> RuntimeModule``.  ``build_runtime`` converts the tree once,
imports first, each node once (a DAG stays a DAG), by looking up the node's class (and its bases):

==========================  =================================================================
loader node                 runtime module
==========================  =================================================================
GraphExecutorFactoryModule  ``GraphExecutorFactoryRuntime`` (``lib["default"](dev)``, params)
ExampleJSONModule           ``ExampleJSONRuntime`` (one function per subgraph symbol)
ConstLoaderModule           ``ConstLoaderRuntime`` (binds constants into its imports)
HostLibraryModule           ``options.host_library(node, imports)``: native functions by symbol
                            (``rpcsrv.native``), or by default ``HostLibraryRuntime``, which
                            lists the symbols and refuses to run them
JSONRuntimeModule           ``JSONRuntime`` (``jsonrt/``: TensorRT, ACL, DNNL, ... graphs on numpy)
UnknownModule (any other)   ``OpaqueRuntime`` (kept in the tree, exports nothing)
==========================  =================================================================

A new kind (the Relax VM executable, ...) is one more entry: ``register_runtime(NodeClass,
factory)``; no duck typing.  Lookup is TVM's everywhere: ``RuntimeModule.find_function`` asks the
module itself, then its imports depth-first (``rpcsrv.loader.modules.walk_imports``, the one walk
shared by loader nodes and runtime modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..loader.modules import (ConstLoaderModule, ExampleJSONModule as ExampleJSONNode, GraphExecutorFactoryModule,
                              HostLibraryModule, ModuleNode)
from .examplejson import ExampleJSONError, ExampleJSONRuntime
from .graph import GraphExecutorModule
from .graph_json import GraphJSONError
from .memory import tune_allocator
from .modules import ConstLoaderRuntime, GraphExecutorFactoryRuntime, HostLibraryRuntime, OpaqueRuntime
from .runtime import ExecutorError, RuntimeModule

__all__ = [
    "build_runtime", "load_module", "register_runtime", "BuildOptions", "RUNTIME_KINDS", "ExecutorError",
    "ExampleJSONError", "GraphJSONError", "RuntimeModule", "GraphExecutorModule", "GraphExecutorFactoryRuntime",
    "ExampleJSONRuntime", "ConstLoaderRuntime", "HostLibraryRuntime", "OpaqueRuntime", "tune_allocator",
]


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
    GraphExecutorFactoryModule: lambda n, imports, _o: GraphExecutorFactoryRuntime(
        n.graph_json, n.params, n.module_name, imports, n.type_key),
    ExampleJSONNode: lambda n, imports, _o: ExampleJSONRuntime(n.code, imports=imports),
    ConstLoaderModule: lambda n, imports, _o: ConstLoaderRuntime(n.arrays, n.const_vars_by_symbol, imports,
                                                                 n.type_key),
    HostLibraryModule: lambda n, imports, o: o.host_library(n, imports),
    ModuleNode: lambda n, imports, _o: OpaqueRuntime(n.type_key, imports),  # UnknownModule and the rest
}


def register_runtime(node_class: type, factory: RuntimeFactory) -> None:
    """Add a module kind: loader nodes of ``node_class`` become ``factory(node, imports, options)``."""
    RUNTIME_KINDS[node_class] = factory


def _factory(node: Any) -> RuntimeFactory:
    for cls in type(node).__mro__:
        factory = RUNTIME_KINDS.get(cls)
        if factory is not None:
            return factory
    raise ExecutorError(f"{type(node).__name__} is not a module of the loader's tree")


def build_runtime(root: Any, options: BuildOptions | None = None) -> RuntimeModule:
    """Runtime modules for the loader's module tree rooted at ``root``; returns the root's.

    Constants of ExampleJSON subgraphs are bound here: first from a const loader that imports the
    module, then from the params of a graph executor factory above it.  A constant left unbound
    is an error now, not at ``run``.  The allocator is tuned for the kernels' large temporaries
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
                if isinstance(sub, ExampleJSONRuntime):
                    for symbol in sub.graphs:
                        sub.bind(symbol, mod.params, "the graph params", only_missing=True)
    for mod in modules:
        if isinstance(mod, ExampleJSONRuntime):
            for symbol in mod.graphs:
                missing = mod.unbound(symbol)
                if missing:
                    raise ExecutorError(f"ExampleJSON subgraph {symbol!r}: constant(s) "
                                        f"{', '.join(map(repr, missing))} not found in a const loader "
                                        f"module or the graph params")
    for mod in modules:  # JSON-runtime modules (jsonrt/): their constants come from a const loader only
        if isinstance(mod, JSONRuntime) and mod.unbound():
            raise ExecutorError(f"{mod.head}: constant(s) {', '.join(map(repr, mod.unbound()))} not found "
                                "in a const loader module")


def load_module(path: str, options: BuildOptions | None = None) -> RuntimeModule:
    """Load an exported library (``.so``, object, raw blob) and build its runtime modules."""
    from ..loader import load_library  # the loader is only needed for files

    return build_runtime(load_library(path).root, options)


from ..loader.vm_executable import VMExecutableModule  # noqa: E402  (the Relax VM kind, issue 12)
from .vm.loading import vm_executable_runtime  # noqa: E402

register_runtime(VMExecutableModule, vm_executable_runtime)

from ..loader.jsonrt import JSONRuntimeModule  # noqa: E402  (TVM's JSON-runtime BYOC kinds, issue 23)
from .jsonrt import JSONRuntime, jsonrt_runtime  # noqa: E402

register_runtime(JSONRuntimeModule, jsonrt_runtime)
