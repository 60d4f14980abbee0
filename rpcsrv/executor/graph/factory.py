"""The graph executor factory: TVM's ``GraphExecutorFactory`` module (``GraphRuntimeFactory`` in 0.7).

``lib[module_name](dev, ...)`` creates a :class:`~rpcsrv.executor.graph.executor.GraphExecutorModule` over the
factory's first import and sets the params, largest first; the factory also answers ``get_graph_json``,
``get_graph_params``, ``remove_params`` and ``debug_create`` (the debug executor, ``debug.py``).  Its graph
JSON is parsed and checked when the library is loaded.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import numpy as np

from ..module import ExecutorError, RuntimeModule
from .executor import GraphExecutorModule, check_devices, zeros
from ...loader.graph_json import parse_graph_json


class GraphExecutorFactoryRuntime(RuntimeModule):
    """The graph executor factory; its graph JSON is checked when the library is loaded."""

    type_key = "GraphExecutorFactory"

    def __init__(self, graph_json: str, params: Mapping[str, np.ndarray], module_name: str = "default",
                 imports: Optional[list[RuntimeModule]] = None, type_key: str = "GraphExecutorFactory", *,
                 allocate: Callable[[int], np.ndarray] = zeros):
        super().__init__(imports)
        self.allocate = allocate  # the storage of the executors it creates (``BuildOptions.allocate``)
        self.type_key = type_key
        self.graph_json = graph_json
        self.graph = parse_graph_json(graph_json)
        self.params = dict(params)
        self.module_name = module_name

    @property
    def lib(self) -> Optional[RuntimeModule]:
        """The module whose tree holds the graph's functions (TVM uses the first import)."""
        return self.imports[0] if self.imports else None

    def create(self, *devices: Any) -> GraphExecutorModule:
        """A new executor with its own buffers, params set largest first (as TVM does)."""
        check_devices(devices)
        executor = GraphExecutorModule(self.graph, self.lib, devices, allocate=self.allocate)
        for name in sorted(self.params, key=lambda k: -self.params[k].nbytes):
            idx = executor.input_map.get(name, -1)
            if idx >= 0:
                executor.set_input(idx, self.params[name])
        return executor

    def debug_create(self, module_name: Any, *devices: Any):
        """TVM's ``debug_create(module_name, dev, ...)``: a debug executor with the params set."""
        from .debug import GraphExecutorDebugModule

        if module_name != self.module_name:
            raise ExecutorError(f"debug_create: this library has module {self.module_name!r}, not {module_name!r}")
        executor = GraphExecutorDebugModule(self.graph, self.lib, check_devices(devices), allocate=self.allocate)
        for name, arr in self.params.items():
            if executor.input_map.get(name, -1) >= 0:
                executor.set_input(name, arr)
        return executor

    def get_function(self, name: str):
        if name == self.module_name:
            return self.create
        if name == "get_graph_json":
            return lambda: self.graph_json
        if name == "get_graph_params":
            return lambda: dict(self.params)
        if name == "remove_params":
            return self._remove_params
        if name == "debug_create":
            return self.debug_create
        if name == "cuda_graph_create":
            return self._unavailable(name)
        return None

    def _remove_params(self) -> "GraphExecutorFactoryRuntime":
        return GraphExecutorFactoryRuntime(self.graph_json, {}, self.module_name, self.imports[:1], self.type_key,
                                           allocate=self.allocate)

    @staticmethod
    def _unavailable(name: str):
        def fail(*_args):
            raise ExecutorError(f"{name}: this executor kind is not available on this board "
                                "(create the plain graph executor instead)")
        return fail


def factory_runtime(node: Any, imports: list[RuntimeModule], options: Any = None) -> GraphExecutorFactoryRuntime:
    """The runtime of a ``GraphExecutorFactory`` node (the built-in kind, ``rpcsrv.loader.modules``); its executors
    take their storage from ``options.allocate`` (``rpcsrv.executor.BuildOptions``)."""
    return GraphExecutorFactoryRuntime(node.graph_json, node.params, node.module_name, imports, node.type_key,
                                       allocate=getattr(options, "allocate", zeros))
