"""Building the runtime modules of a loaded module tree: :func:`build_runtime`, :func:`load_module`.

``load_module(path)`` is what ``tvm.rpc.server.load_module`` does on this board: parse the
library without loading it (``rpcsrv.loader``), then :func:`build_runtime` makes a runtime module
for each node of the module tree, keeping the import structure, and checks everything that can
be checked before any data arrives (graph JSON, ExampleJSON text and ops, constants).

Module kinds: one registry, one walk
------------------------------------
Each node's runtime module comes from its kind (the one registry, ``rpcsrv.loader.node.REGISTRY``:
``ModuleKind.runtime``, ``factory(node, imports, options) -> RuntimeModule``): the built-in kinds, whose
runtimes the executor attaches (``runtimes.py``: the graph executor factory, the const loader, ExampleJSON,
the Relax VM, the JSON runtime, and the host library, which becomes ``options.host_library(node, imports)``:
native functions by symbol (``rpcsrv.native``), or by default ``HostLibraryRuntime``, which lists the
symbols and refuses to run them), and those of installed packages (entry-point group ``rpcsrv.runtimes``).
A module no kind decodes (``UnknownModule``) becomes ``OpaqueRuntime``, kept in the tree and exporting
nothing, unless an installed plugin that is turned off would take it: then the library is refused here,
naming the plugin (``rpcsrv.loader.plugins.refusal``).  A kind that decodes but has no runtime (a
codec a compiler added) is refused the same way.  ``build_runtime`` converts the tree once, imports first,
each node once (a DAG stays a DAG), then links constants through the modules' own hooks
(``RuntimeModule.bind_constants``, ``bind_params``, ``check_constants``): no kind is special here.  Lookup
is TVM's everywhere: ``RuntimeModule.find_function`` asks the module itself, then its imports depth-first
(``rpcsrv.loader.node.walk_imports``, the one walk shared by loader nodes and runtime modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..loader.modules import HostLibraryModule
from ..loader.node import REGISTRY, UnknownModule
from ..loader.plugins import claimant, refusal
from .const_loader import ConstLoaderRuntime
from .graph.factory import GraphExecutorFactoryRuntime
from .memory import tune_allocator
from .module import ExecutorError, RuntimeModule
from .placeholders import HostLibraryRuntime, OpaqueRuntime


def _placeholder_library(node: HostLibraryModule, imports: list[RuntimeModule]) -> RuntimeModule:
    return HostLibraryRuntime(list(node.symbols), imports, node.type_key)


def _zeros(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


@dataclass(frozen=True)
class BuildOptions:
    """How the runtime modules of a tree are built where they run: the board's policy, passed down.

    * ``host_library(node, imports)`` makes the runtime module of a host library (native code); the
      default lists its symbols and refuses to run them (``rpcsrv serve --no-native``);
    * ``allocate(nbytes)`` gives the zero-filled ``uint8`` storage pools of the graph executors built from
      the tree (a native worker's: its shared arena, so that the session maps their outputs without a copy).
    """

    host_library: Callable[[HostLibraryModule, list[RuntimeModule]], RuntimeModule] = _placeholder_library
    allocate: Callable[[int], np.ndarray] = _zeros


RuntimeFactory = Callable[[Any, list[RuntimeModule], BuildOptions], RuntimeModule]


def _factory(node: Any) -> RuntimeFactory:
    """The runtime factory of ``node``'s kind (see the module doc)."""
    kind = REGISTRY.kind_of(node)
    if kind is not None and kind.runtime is not None:
        return kind.runtime
    if isinstance(node, UnknownModule) and claimant(node.type_key) is None:
        return _opaque  # kept: the tree keeps its shape
    raise ExecutorError(f"{refusal(node.type_key)}; this board cannot load the library")


def _opaque(node: Any, imports: list[RuntimeModule], _options: BuildOptions) -> RuntimeModule:
    return OpaqueRuntime(node.type_key, imports)


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
