"""Host libraries as runtime modules: the ``HostLibraryModule`` entry of the module-kind table.

``native_options()`` gives ``rpcsrv.executor.BuildOptions`` whose ``host_library`` opens the
library in this process (:func:`rpcsrv.native.library.open_library`) and wraps it in a
:class:`NativeLibraryRuntime`; a library without native functions (our exporter's blob-only .so)
stays the listing placeholder.  ``load_native_module(path)`` loads a file with them and points
every library's lookups at the tree's root, as TVM's loader does.
"""

from __future__ import annotations

from typing import Any, Optional

from ..executor import BuildOptions, HostLibraryRuntime, RuntimeModule, build_runtime
from ..loader import load_library
from ..loader.modules import HostLibraryModule
from .library import NativeError, NativeFunction, NativeLibrary, inspect_native, open_library


class NativeLibraryRuntime(RuntimeModule):
    """A host library's native functions, by name (type key ``library`` or ``_lib``)."""

    def __init__(self, library: NativeLibrary, imports: Optional[list[RuntimeModule]] = None,
                 type_key: str = "library"):
        super().__init__(imports)
        self.library = library
        self.type_key = type_key

    def get_function(self, name: str) -> Optional[NativeFunction]:
        return self.library.get_function(name)

    def __repr__(self) -> str:
        return f"<NativeLibraryRuntime {self.library.path} imports={len(self.imports)}>"


def has_native_code(node: HostLibraryModule) -> bool:
    """Whether a host library node has functions to run (an ELF file with public functions)."""
    if node.path is None or not node.symbols:
        return False
    try:
        return bool(inspect_native(node.path).public_functions())
    except NativeError:
        return False


def _open(node: HostLibraryModule, imports: list[RuntimeModule]) -> RuntimeModule:
    if not has_native_code(node):
        return HostLibraryRuntime(list(node.symbols), imports, node.type_key)
    return NativeLibraryRuntime(open_library(node.path), imports, node.type_key)


def native_options() -> BuildOptions:
    """Build options that run host libraries in this process."""
    return BuildOptions(host_library=_open)


def link_roots(root: RuntimeModule) -> RuntimeModule:
    """Point the lookups of every native library in the tree at ``root`` (TVM's module context)."""
    for mod in root.walk():
        if isinstance(mod, NativeLibraryRuntime) and mod.library.root is None:
            mod.library.root = root
    return root


def load_native_module(path: str) -> RuntimeModule:
    """Load a library file with its native functions callable in this process."""
    return link_roots(build_runtime(load_library(path).root, native_options()))


def tree_has_native_code(root: Any) -> bool:
    """Whether a loader tree has a host library with native functions."""
    return any(isinstance(n, HostLibraryModule) and has_native_code(n) for n in root.walk())
