"""The board's executor: turns a loaded module tree into runtime modules and runs graphs.

``load_module(path)`` is what ``tvm.rpc.server.load_module`` does on this board: parse the
library without loading it (``rpcsrv.loader``), then :func:`build_runtime` makes a runtime module
for each node of the module tree, keeping the import structure, and checks everything that can
be checked before any data arrives (graph JSON, ExampleJSON text and ops, constants).
"""

from __future__ import annotations

from typing import Any

from .examplejson import ExampleJSONError, ExampleJSONModule
from .graph import GraphExecutorModule
from .graph_json import GraphJSONError
from .memory import tune_allocator
from .modules import ConstLoaderRuntime, GraphExecutorFactoryRuntime, HostLibraryRuntime, OpaqueRuntime
from .runtime import ExecutorError, RuntimeModule

__all__ = [
    "build_runtime", "load_module", "ExecutorError", "ExampleJSONError", "GraphJSONError",
    "RuntimeModule", "GraphExecutorModule", "GraphExecutorFactoryRuntime", "ExampleJSONModule",
    "ConstLoaderRuntime", "HostLibraryRuntime", "OpaqueRuntime", "tune_allocator",
]


def _convert(node: Any, imports: list[RuntimeModule], library_path: str | None = None) -> RuntimeModule:
    """One loader node as a runtime module (the node kinds are told apart by their fields)."""
    type_key = getattr(node, "type_key", type(node).__name__)
    if type_key == "relax.VMExecutable":
        from .vm.loading import vm_executable_runtime

        return vm_executable_runtime(node, imports, library_path)
    if hasattr(node, "graph_json"):
        return GraphExecutorFactoryRuntime(node.graph_json, node.params,
                                           getattr(node, "module_name", "default"), imports)
    if hasattr(node, "code"):
        return ExampleJSONModule(node.code, imports=imports)
    if hasattr(node, "const_vars_by_symbol"):
        return ConstLoaderRuntime(node.arrays, node.const_vars_by_symbol, imports, type_key)
    if hasattr(node, "symbols"):
        return HostLibraryRuntime(list(node.symbols), imports, type_key)
    return OpaqueRuntime(type_key, imports)


def build_runtime(root: Any, library_path: str | None = None) -> RuntimeModule:
    """Runtime modules for the loader's module tree rooted at ``root``; returns the root's.

    Constants of ExampleJSON subgraphs are bound here: first from a const loader that imports the
    module, then from the params of a graph executor factory above it.  A constant left unbound
    is an error now, not at ``run``.  The allocator is tuned for the kernels' large temporaries
    first (:func:`rpcsrv.executor.memory.tune_allocator`, once per process).
    """
    tune_allocator()
    built: dict[int, RuntimeModule] = {}

    def convert(node: Any, depth: int) -> RuntimeModule:
        if id(node) in built:
            return built[id(node)]
        if depth > 64:
            raise ExecutorError("the module import tree is too deep (a cycle?)")
        imports = [convert(child, depth + 1) for child in getattr(node, "imports", [])]
        built[id(node)] = convert_one = _convert(node, imports, library_path)
        return convert_one

    top = convert(root, 0)
    modules = list(top.walk())
    for mod in modules:
        if isinstance(mod, ConstLoaderRuntime):
            mod.bind_imports()
    for mod in modules:
        if isinstance(mod, GraphExecutorFactoryRuntime):
            for sub in mod.walk():
                if isinstance(sub, ExampleJSONModule):
                    for symbol in sub.graphs:
                        sub.bind(symbol, mod.params, "the graph params", only_missing=True)
    for mod in modules:
        if isinstance(mod, ExampleJSONModule):
            for symbol in mod.graphs:
                missing = mod.unbound(symbol)
                if missing:
                    raise ExecutorError(f"ExampleJSON subgraph {symbol!r}: constant(s) "
                                        f"{', '.join(map(repr, missing))} not found in a const loader "
                                        f"module or the graph params")
    return top


def load_module(path: str) -> RuntimeModule:
    """Load an exported library (``.so``, object, raw blob) and build its runtime modules."""
    from ..loader import load_library  # the loader is only needed for files

    loaded = load_library(path)
    root = getattr(loaded, "root", loaded)
    return build_runtime(root, library_path=path)
