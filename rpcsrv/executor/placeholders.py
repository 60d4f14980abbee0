"""Placeholders that keep a module's place in the tree without running it.

* ``HostLibraryRuntime`` — host code compiled into the .so when native code is off (``rpcsrv
  serve --no-native``) or no native layer is given: its symbols are listed, asking for one is a
  clear error.  With native code on, ``rpcsrv.native`` builds the host library's module instead.
* ``OpaqueRuntime`` — any other module type: kept in the tree, exports nothing.
"""

from __future__ import annotations

from typing import Optional

from .module import ExecutorError, RuntimeModule


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
