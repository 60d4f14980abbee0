"""Find the module blob inside a library file without loading it.

What the blob symbol holds, and the symbol names, are declared in ``location.py``.  A *raw blob
file* is exactly a symbol's content (8-byte length, then the blob; what TVM's
``ModulePackImportsToNDArray`` returns too), the layout read from the blob itself.

Containers
----------
* ELF (``\\x7fELF``), any class, byte order and machine, shared objects, executables and
  relocatable objects.  pyelftools reads headers, sections, symbol tables and, when the section
  headers are stripped, the dynamic segment's symbol table; we only map the symbol to file bytes
  (through its section, or the ``PT_LOAD`` segment holding its address) and check every bound.
* Mach-O 64-bit (``0xfeedfacf``), objects and dylibs (``macho.py``): the headers are declared by
  macholib's ``mach_o`` structures; we walk the load commands ourselves (``LC_SEGMENT_64``
  sections and ``LC_SYMTAB``) so that every offset is checked against the file before use.
* Universal (fat) Mach-O: each 64-bit slice is searched, the first holding the blob is used.
* tar (``export_library("x.tar")``): each regular member that is an ELF or Mach-O object is
  searched in place (no extraction, no copy); a ``devc.c`` member (TVM without LLVM writes the
  ``PackImportsToC`` source instead of an object) is decoded from its hex array (a copy).
* A symbol with a system-lib prefix (``<prefix>__tvm_dev_mblob``) is found like the plain one.
* anything else is taken as a raw blob file.
"""

from __future__ import annotations

import re
import tarfile

from .elf import find_in_elf
from .errors import BytesReader, LoaderError
from .location import (
    BLOB_SYMBOL, FFI_BLOB_SYMBOL, HEADER, SYMBOL_LAYOUTS, BlobLocation, NoSymbol, blob_symbol, no_symbol, read_header,
)
from .macho import FAT_MAGICS, MACHO32_MAGICS, MACHO_MAGICS, find_in_fat, find_in_macho


def find_blob(data: memoryview) -> BlobLocation:
    """Locate the blob in a whole file's bytes, whatever the container."""
    magic = bytes(data[:4])
    if magic == b"\x7fELF":
        return find_in_elf(data)
    if magic in MACHO_MAGICS:
        return find_in_macho(data)
    if magic in MACHO32_MAGICS:
        raise LoaderError("32-bit Mach-O at offset 0: not supported (expected a 64-bit Mach-O)")
    if magic in FAT_MAGICS:
        return find_in_fat(data)
    if len(data) >= 262 and bytes(data[257:262]) == b"ustar":
        return find_in_tar(data)
    if magic[:2] == b"MZ":
        raise LoaderError("Windows PE/DLL at offset 0: not supported (expected ELF, Mach-O, tar "
                          "or a raw blob)")
    if len(data) < HEADER:
        raise LoaderError(f"file of {len(data)} bytes is no library and no raw blob "
                          f"(expected at least the 8-byte blob length)")
    offset, size = read_header(data, 0, len(data), "raw blob file")
    return BlobLocation("raw", "any", offset, size, None)


def find_in_tar(data: memoryview) -> BlobLocation:
    """Search the object members of an ``export_library`` tar for the blob symbol."""
    try:
        with tarfile.open(fileobj=BytesReader(data), mode="r:") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, EOFError, ValueError) as exc:
        raise LoaderError(f"malformed tar file (expected a tar written by export_library): "
                          f"{exc}") from None
    tried, found, functions = [], None, set()
    for m in members:
        start, end = m.offset_data, m.offset_data + m.size
        if end > len(data):
            raise LoaderError(f"tar member {m.name!r} at offset {start} runs past the end")
        head = bytes(data[start:start + 4])
        is_c = m.name.endswith(".c")
        if head != b"\x7fELF" and head not in MACHO_MAGICS and not is_c:
            continue
        tried.append(m.name)
        try:
            loc = find_in_c_source(data[start:end]) if is_c else find_blob(data[start:end])
        except NoSymbol as exc:
            functions.update(exc.functions)
            continue
        except LoaderError as exc:  # offsets inside the member: say where the member starts
            raise LoaderError(f"tar member {m.name!r} (data at file offset {start}): {exc}") from None
        functions.update(loc.symbols)
        if found is None:
            loc.offset += start if loc.buffer is None else 0
            loc.container, loc.member = "tar", m.name
            found = loc
    if found is not None:
        found.symbols = sorted(functions)
        return found
    raise LoaderError(f"tar file: no object member defines {BLOB_SYMBOL} or {FFI_BLOB_SYMBOL} "
                      f"(expected one in devc.o or another object member; searched "
                      f"{tried or 'no ELF/Mach-O members'})")


_C_ARRAY = re.compile(rb"const unsigned char (\w*(?:__tvm_dev_mblob|__tvm_ffi__library_bin))"
                      rb"\[(\d+)\] = \{")
_C_BYTE = re.compile(rb"0x([0-9a-fA-F]{2}),")


def find_in_c_source(data: memoryview) -> BlobLocation:
    """Decode the blob array of the ``devc.c`` that ``export_library`` puts in a tar when TVM has
    no LLVM (``PackImportsToC`` output).  The blob is copied out of the text into ``buffer``."""
    text = bytes(data)
    m = _C_ARRAY.search(text)
    if m is None:
        raise no_symbol("C source", "any")
    name, declared = m.group(1).decode(), int(m.group(2))
    if declared * 5 > len(text) - m.end():
        raise LoaderError(f"C source: array {name} at offset {m.start()} declares {declared} bytes, "
                          f"more than the text holds (expected 5 characters per byte)")
    close = text.find(b"}", m.end())
    hexes = _C_BYTE.findall(text, m.end(), close if close >= 0 else len(text))
    if len(hexes) != declared:
        raise LoaderError(f"C source: array {name} at offset {m.start()} declares {declared} bytes "
                          f"but lists {len(hexes)} (expected one 0x.. per byte)")
    content = bytes.fromhex(b"".join(hexes).decode())
    offset, size = read_header(memoryview(content), 0, len(content), f"C array {name}")
    return BlobLocation("c", "any", offset, size, SYMBOL_LAYOUTS[blob_symbol(name)], name,
                        buffer=content)
