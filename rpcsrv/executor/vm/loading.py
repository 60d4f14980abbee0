"""The ``relax.VMExecutable`` entry of the module-kind table, and where its kernels come from.

Kernels are the ``__tvm_ffi_<name>`` functions of the host library (``_lib``) the executable
imports.  When the tree was built with native code on (``rpcsrv.native.native_options``, e.g. in
the native worker), that library is already a module of the tree and its functions are used.
Otherwise (the default build) the library file named by the loader's ``HostLibraryModule`` is
opened with ``rpcsrv.native.open_library`` when the executable is loaded, so a VM can run its
kernels; a library that cannot run here (another machine, no runtime shim) is refused then, with
``rpcsrv.native``'s reason.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ...loader.modules import HostLibraryModule
from ..runtime import RuntimeModule
from .ffi import NativeKernel
from .machine import VMExecutableRuntime

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


def _native_library(node: Any, imports: list[RuntimeModule]) -> Optional[Any]:
    """The opened native library the executable's kernels live in, if any."""
    for mod in imports:
        for sub in mod.walk():
            library = getattr(sub, "library", None)
            if library is not None and hasattr(library, "get_function"):
                return library
    for child in node.imports:
        for sub in child.walk():
            if (isinstance(sub, HostLibraryModule) and sub.path
                    and any(s.startswith(FFI_PREFIX) for s in sub.symbols)):
                from ...native import open_library  # native code is only loaded for such libraries

                return open_library(sub.path)
    return None


def vm_executable_runtime(node: Any, imports: list[RuntimeModule], _options: Any = None) -> RuntimeModule:
    """The runtime module of the loader's ``VMExecutableModule`` ``node`` (imports already built)."""
    library = _native_library(node, imports)
    runtime = VMExecutableRuntime(node, imports, _kernels(library.get_function) if library else None)
    if library is not None and getattr(library, "root", False) is None:
        library.root = runtime  # lookups from compiled code search the tree from here (TVM's context)
    return runtime
