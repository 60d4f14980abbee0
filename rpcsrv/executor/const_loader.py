"""TVM's const loader: ``ConstLoaderModule`` (``metadata`` before 0.9).

It holds named constants and the list each external symbol needs, and binds them into the modules it
imports when the tree is built (``bind_imports``, called by ``build_runtime``: a module's own
``bind_constants`` hook, else its ``__init_<symbol>`` function, as TVM does).  Its imports' functions are
reachable through it, like TVM's.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from .module import ExecutorError, RuntimeModule


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


def const_loader_runtime(node: Any, imports: list[RuntimeModule], _options: Any = None) -> ConstLoaderRuntime:
    """The runtime of a ``const_loader`` / ``metadata`` node."""
    return ConstLoaderRuntime(node.arrays, node.const_vars_by_symbol, imports, node.type_key)
