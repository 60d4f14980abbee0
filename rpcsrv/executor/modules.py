"""Runtime modules of the graph executor's built-in kinds, and the tree's placeholders.

* ``GraphExecutorFactoryModule`` — TVM's ``GraphExecutorFactory``: ``lib[module_name](dev, ...)``
  creates a :class:`GraphExecutorModule` over the factory's first import and sets the params;
  also ``get_graph_json``, ``get_graph_params``, ``remove_params``.
* ``ConstLoaderRuntime`` — TVM's ``ConstLoaderModule`` (``metadata`` before 0.9): holds named
  constants and the list each external symbol needs, binds them into the modules it imports.
* ``HostLibraryRuntime`` — host code compiled into the .so when native code is off (``rpcsrv
  serve --no-native``) or no native layer is given: its symbols are listed, asking for one is a
  clear error.  With native code on, ``rpcsrv.native`` builds the host library's module instead.
* ``OpaqueRuntime`` — any other module type: kept in the tree, exports nothing.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from .graph import GraphExecutorModule, check_devices
from .graph_json import parse_graph_json
from .runtime import ExecutorError, RuntimeModule


class GraphExecutorFactoryRuntime(RuntimeModule):
    """The graph executor factory; its graph JSON is checked when the library is loaded."""

    type_key = "GraphExecutorFactory"

    def __init__(self, graph_json: str, params: Mapping[str, np.ndarray], module_name: str = "default",
                 imports: Optional[list[RuntimeModule]] = None, type_key: str = "GraphExecutorFactory"):
        super().__init__(imports)
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
        executor = GraphExecutorModule(self.graph, self.lib, devices)
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
        executor = GraphExecutorDebugModule(self.graph, self.lib, check_devices(devices))
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
        return GraphExecutorFactoryRuntime(self.graph_json, {}, self.module_name, self.imports[:1], self.type_key)

    @staticmethod
    def _unavailable(name: str):
        def fail(*_args):
            raise ExecutorError(f"{name}: this executor kind is not available on this board "
                                "(create the plain graph executor instead)")
        return fail


class ConstLoaderRuntime(RuntimeModule):
    """TVM's const loader: constants by name, and which names each external symbol needs."""

    type_key = "const_loader"

    def __init__(self, arrays: Mapping[str, np.ndarray], const_vars_by_symbol: Mapping[str, list[str]],
                 imports: Optional[list[RuntimeModule]] = None, type_key: str = "const_loader"):
        super().__init__(imports)
        self.type_key = type_key
        self.arrays = dict(arrays)
        self.const_vars_by_symbol = {k: list(v) for k, v in const_vars_by_symbol.items()}
        for symbol, names in self.const_vars_by_symbol.items():
            for name in names:
                if name not in self.arrays:
                    raise ExecutorError(f"{type_key} module is missing constant {name!r} for function {symbol!r}")

    def bind_imports(self) -> None:
        """Give each imported module the constants of its symbols (TVM's ``__init_<symbol>``)."""
        for symbol, names in self.const_vars_by_symbol.items():
            arrays = [self.arrays[n] for n in names]
            for mod in self.imports:
                if mod.bind_constants(symbol, dict(zip(names, arrays)), f"the {self.type_key} module"):
                    break
                init = mod.get_function(f"__init_{symbol}")
                if init is not None:
                    init(arrays)
                    break

    def get_function(self, name: str):
        if name == "get_const_var_ndarray":
            return lambda: dict(self.arrays)
        for mod in self.imports:  # like TVM: the imports' functions are reachable through this module
            fn = mod.get_function(name)
            if fn is not None:
                return fn
        return None


class HostLibraryRuntime(RuntimeModule):
    """The host code of the library (``_lib``): listed, but not run (native code is off)."""

    def __init__(self, symbols: list[str], imports: Optional[list[RuntimeModule]] = None,
                 type_key: str = "library", reason: str = "native code is disabled on this server"):
        super().__init__(imports)
        self.type_key = type_key
        self.symbols = set(symbols)
        self.reason = reason

    def get_function(self, name: str):
        if name in self.symbols or f"__tvm_ffi_{name}" in self.symbols:
            raise ExecutorError(f"host function {name} cannot run: {self.reason}")
        return None


class OpaqueRuntime(RuntimeModule):
    """A module of a type this board does not run; it only keeps its place in the tree."""

    opaque = True

    def __init__(self, type_key: str, imports: Optional[list[RuntimeModule]] = None):
        super().__init__(imports)
        self.type_key = type_key


def factory_runtime(node: Any, imports: list[RuntimeModule], _options: Any = None) -> GraphExecutorFactoryRuntime:
    """The runtime of a ``GraphExecutorFactory`` node (the built-in kind, ``rpcsrv.loader.modules``)."""
    return GraphExecutorFactoryRuntime(node.graph_json, node.params, node.module_name, imports, node.type_key)


def const_loader_runtime(node: Any, imports: list[RuntimeModule], _options: Any = None) -> ConstLoaderRuntime:
    """The runtime of a ``const_loader`` / ``metadata`` node."""
    return ConstLoaderRuntime(node.arrays, node.const_vars_by_symbol, imports, node.type_key)
