"""Where the blob sits in a container: the blob symbols, ``BlobLocation`` and the length header.

This is the leaf every container reader (``containers.py``, ``elf.py``, ``macho.py``) builds on;
it imports nothing of theirs, so ``containers`` can import the readers at module level.

What a blob symbol holds (the contract with the client exporter): TVM's ``PackImportsToC`` layout,
an 8-byte little-endian length ``n`` (on every target, also big-endian ones), then the ``n`` blob
bytes.  The symbol name tells the layout: ``__tvm_dev_mblob`` a classic (or legacy) blob,
``__tvm_ffi__library_bin`` a tvm-ffi blob; Mach-O prefixes C symbols with ``_`` and a system-lib
build prefixes them with its own name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from construct import GreedyBytes, Int64ul, Prefixed

from .errors import LoaderError

BLOB_SYMBOL = "__tvm_dev_mblob"
FFI_BLOB_SYMBOL = "__tvm_ffi__library_bin"
#: symbol name -> layout family ("classic" covers the legacy layout too)
SYMBOL_LAYOUTS = {BLOB_SYMBOL: "classic", FFI_BLOB_SYMBOL: "ffi"}
#: what a blob symbol holds, and what a raw blob file is: the blob's length, then the blob.  The
#: exporter builds it (``symbol_content``), the container readers parse its length (``read_header``).
SymbolContent = Prefixed(Int64ul, GreedyBytes)
HEADER = SymbolContent.lengthfield.sizeof()  # the u64 length in front of the blob


def symbol_content(blob: bytes) -> bytes:
    """The bytes to put behind a blob symbol (or in a raw blob file) for ``blob``."""
    return SymbolContent.build(blob)


def blob_symbol(name: str) -> str | None:
    """The blob symbol ``name`` stands for, also with a system-lib prefix (``<prefix>__tvm_...``)."""
    for symbol in SYMBOL_LAYOUTS:
        if name.endswith(symbol):
            return symbol
    return None


@dataclass
class BlobLocation:
    """Where the blob sits: ``offset``/``size`` of the blob proper (after its 8-byte length)."""

    container: str
    arch: str
    offset: int
    size: int
    layout: str | None  # from the symbol name; None for raw files (read from the blob)
    symbol: str | None = None
    symbols: list[str] = field(default_factory=list)  # the host library's function symbols
    member: str | None = None  # tar member holding the blob
    buffer: bytes | None = None  # set when the blob is not in the file's bytes (C source, compressed tar)


def read_header(data: memoryview, at: int, limit: int, what: str) -> tuple[int, int]:
    """Check the 8-byte length at ``at`` and that the blob fits before ``limit``: (offset, size)."""
    if at < 0 or at + HEADER > limit:
        raise LoaderError(f"{what}: blob length header at offset {at} runs past the end "
                          f"(expected 8 bytes before offset {limit})")
    size = SymbolContent.lengthfield.parse(data[at:at + HEADER])
    if size > limit - at - HEADER:
        raise LoaderError(f"{what}: blob size header at offset {at} says {size} bytes, but only "
                          f"{limit - at - HEADER} bytes follow (expected a size that fits)")
    return at + HEADER, size


class NoSymbol(LoaderError):
    """The container is fine but holds neither blob symbol; ``functions`` are its functions."""

    functions: list[str] = []
    arch: str = ""


def no_symbol(container: str, arch: str, functions: list[str] | None = None) -> NoSymbol:
    """The error for a well-formed container without a blob symbol (callers may try the next one)."""
    exc = NoSymbol(f"{container} ({arch}): no symbol {BLOB_SYMBOL} or {FFI_BLOB_SYMBOL} found "
                   f"(expected a library written by TVM's export_library or our exporter)")
    exc.functions = list(functions or [])
    exc.arch = arch
    return exc
