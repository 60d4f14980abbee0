"""The ``relax.VMExecutable`` entry of the module-kind table, and where its kernels come from.

Kernels are the ``__tvm_ffi_<name>`` functions of the host library (``_lib``) the executable
imports.  The tree is built with native code on (``rpcsrv.native.native_options``: the session's
native worker, ``rpcsrv serve --native inprocess``, ``rpcsrv.native.load_native_module``), so that
library is a module of the tree and its functions are the kernels.  The executor never opens native
code by itself: built without native code, the executable is refused when loaded, naming the
kernels it cannot run (``VMExecutableRuntime``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..module import RuntimeModule
from .ffi import NativeKernel
from .executable import VMExecutableRuntime

FFI_PREFIX = "__tvm_ffi_"


def _kernels(get_function: Callable[[str], Any]) -> Callable[[str], Any]:
    """name -> the VM's fast kernel for a tvm-ffi native function (other functions as they are)."""
    cache: dict[str, Any] = {}

    def lookup(name: str) -> Any:
        if name not in cache:
            try:
                fn = get_function(name)
            except Exception:  # noqa: BLE001 - a symbol the library lists but cannot give: missing
                fn = None
            tvm_ffi = fn is not None and getattr(fn, "symbol", "").startswith(FFI_PREFIX)
            cache[name] = NativeKernel.from_native(fn) if tvm_ffi else fn
        return cache[name]
    return lookup


def _native_library(imports: list[RuntimeModule]) -> Optional[Any]:
    """The opened native library (``rpcsrv.native``) the executable's kernels live in, if any."""
    for mod in imports:
        for sub in mod.walk():
            library = getattr(sub, "library", None)
            if library is not None and hasattr(library, "get_function"):
                return library
    return None


def vm_executable_runtime(node: Any, imports: list[RuntimeModule], _options: Any = None) -> RuntimeModule:
    """The runtime module of the loader's ``VMExecutableModule`` ``node`` (imports already built)."""
    library = _native_library(imports)
    runtime = VMExecutableRuntime(node, imports, _kernels(library.get_function) if library else None)
    if library is not None and getattr(library, "root", False) is None:
        library.root = runtime  # lookups from compiled code search the tree from here (TVM's context)
    return runtime
