"""The board's executor: turns a loaded module tree into runtime modules and runs them.

This package's namespace is its public interface (the names below, for the board, the native layer,
plugins, tests and benches); each job has its own module (docs/architecture.md, docs/executor.md):

* ``build.py``: :func:`build_runtime`, :func:`load_module`, :class:`BuildOptions` (a runtime module per node of
  the tree, by its kind in the one registry of kinds); ``runtimes.py``: the built-in kinds' runtimes, attached
  to the registry when this package is imported;
* ``module.py``: the runtime object model: :class:`RuntimeModule`, :class:`ExecutorError`, ``STEP_HOOK``;
* ``placeholders.py`` (the host library without native code, unknown modules), ``const_loader.py``;
* ``graph/``: the graph executor, its factory and its debug variant; ``examplejson/``: the ExampleJSON
  kind (its text, its runtime and the rewrites of its subgraphs); ``jsonrt/``: TVM's JSON-runtime BYOC
  modules; ``vm/``: the Relax VM; ``kernels/``: the numpy kernels and their compiled C kernels;
* ``compute.py`` (BLAS threads per job), ``memory.py`` (the allocator, the accounting hook).
"""

from __future__ import annotations

from . import runtimes  # noqa: F401  (attaches the built-in kinds' runtimes to the registry)
from .build import BuildOptions, build_runtime, load_module
from .const_loader import ConstLoaderRuntime
from .examplejson.subgraphs import ExampleJSONRuntime
from .examplejson.text import ExampleJSONError
from .graph.executor import GraphExecutorModule
from .graph.factory import GraphExecutorFactoryRuntime
from ..loader.graph_json import GraphJSONError
from .memory import tune_allocator
from .module import ExecutorError, RuntimeModule
from .placeholders import HostLibraryRuntime, OpaqueRuntime

__all__ = [
    "build_runtime", "load_module", "BuildOptions", "ExecutorError",
    "ExampleJSONError", "GraphJSONError", "RuntimeModule", "GraphExecutorModule", "GraphExecutorFactoryRuntime",
    "ExampleJSONRuntime", "ConstLoaderRuntime", "HostLibraryRuntime", "OpaqueRuntime", "tune_allocator",
]
