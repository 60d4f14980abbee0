"""How a loaded ``relax.VMExecutable`` finds its kernels: the host library (``_lib``) it imports.

The kernels are the library's ``__tvm_ffi_<name>`` symbols.  Until the native host
(``rpcsrv.native``) runs them in a worker, they are loaded here with ctypes from the library file
(``ffi.load_kernels``), once per loaded module tree, and only when the executable calls a kernel.
"""

from __future__ import annotations

from typing import Any, Optional

from ..runtime import RuntimeModule
from .machine import VMExecutableRuntime


def _host_symbols(imports: list[RuntimeModule]) -> Optional[set[str]]:
    for mod in imports:
        for sub in mod.walk():
            symbols = getattr(sub, "symbols", None)
            if symbols is not None:
                return set(symbols)
    return None


def vm_executable_runtime(node: Any, imports: list[RuntimeModule], library_path: Optional[str]) -> RuntimeModule:
    """The runtime module of executable ``node`` whose imports are ``imports``."""
    symbols = _host_symbols(imports)
    lookup = None
    if symbols and library_path and any(s.startswith("__tvm_ffi_") for s in symbols):
        from .ffi import load_kernels

        lookup = load_kernels(library_path, symbols)
    return VMExecutableRuntime(node, imports, lookup)
