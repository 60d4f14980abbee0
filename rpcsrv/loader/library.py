"""``load_library``: from a file (or its bytes) to the module tree, without loading the library.

Files are memory-mapped read-only, so the blob is never copied: params and constants come out
as read-only numpy views over the mapping, and pages are read only when an array is used.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from .blob import parse_blob_ex
from .containers import find_blob
from .location import NoSymbol
from .errors import LoaderError
from .modules import HostLibraryModule, ModuleNode


@dataclass(eq=False)
class LoadedLibrary:
    """A library's module tree and where it came from.

    ``container`` is "elf", "macho", "tar" or "raw"; ``arch`` e.g. "x64 ELF64 le" or "ARM64";
    ``layout`` is "classic", "legacy" or "ffi", or "none" for a library without a blob (a plain
    host module, as in TVM: its root is a ``HostLibraryModule`` of type key ``library``);
    ``symbols`` the host library's function symbols.
    """

    path: str | None
    container: str
    arch: str
    layout: str
    root: ModuleNode
    symbols: list[str]
    symbol: str | None = None  # the blob symbol found (None for raw files)
    blob_offset: int = 0  # file offset of the blob (after its 8-byte length)
    blob_size: int = 0
    member: str | None = None  # tar member that held the blob

    def modules(self) -> list[ModuleNode]:
        """Every module of the tree, root first, depth-first, each once."""
        return list(self.root.walk())


def _map(source) -> tuple[memoryview, str | None]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return memoryview(source).cast("B"), None
    path = os.fspath(source)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise LoaderError(f"{path}: empty file (expected a library or a raw blob)")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return memoryview(mapped), path


def load_library(source: str | os.PathLike | bytes) -> LoadedLibrary:
    """Read a library (path or bytes) and decode its module tree.

    Raises ``LoaderError`` (message with offset and expectation) for anything malformed.
    """
    data, path = _map(source)
    try:
        loc = find_blob(data)
    except NoSymbol as exc:  # no blob: the library is one host module (TVM's LibraryModule)
        root = HostLibraryModule(list(exc.functions), type_key="library", path=path)
        container = {b"\x7fELF": "elf"}.get(bytes(data[:4]), "macho")
        return LoadedLibrary(path, container, exc.arch, "none", root, list(exc.functions))
    except LoaderError as exc:
        raise LoaderError(f"{path}: {exc}") if path is not None else exc from None
    try:
        holder = data if loc.buffer is None else memoryview(loc.buffer)
        blob = holder[loc.offset:loc.offset + loc.size]
        root, layout = parse_blob_ex(blob, loc.layout, base=loc.offset)
    except LoaderError as exc:
        if path is not None:
            raise LoaderError(f"{path}: {exc}") from None
        raise
    for mod in root.walk():
        if isinstance(mod, HostLibraryModule):
            mod.symbols = list(loc.symbols)
            mod.path = path if loc.container == "elf" else None  # a tar or raw blob cannot be loaded
    return LoadedLibrary(path, loc.container, loc.arch, layout, root, list(loc.symbols), loc.symbol,
                         loc.offset, loc.size, loc.member)
