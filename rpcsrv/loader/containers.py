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
  ``PackImportsToC`` source instead of an object) is decoded from its hex array (a copy; ``csource.py``).
  TVM's own tars are gzip-compressed (its tar helper runs ``tar -czf``): any tar ``tarfile``
  opens (gzip, bzip2, xz) is read, its object members decompressed one by one (a copy each,
  bounded by ``MAX_EXPANSION`` times the file size).
* A symbol with a system-lib prefix (``<prefix>__tvm_dev_mblob``) is found like the plain one.
* anything else is taken as a raw blob file when its first 8 bytes are a length that fits the file
  (or the bytes after them start like a blob, so a truncated blob says so); any other file is
  ``NOT_A_LIBRARY``.
"""

from __future__ import annotations

import itertools
import lzma
import tarfile
import zlib

from .blob import looks_like_blob
from .csource import find_in_c_source
from .elf import find_in_elf
from .errors import BytesReader, LoaderError
from .location import (
    BLOB_SYMBOL, FFI_BLOB_SYMBOL, HEADER, BlobLocation, NoSymbol, read_header,
)
from .macho import FAT_MAGICS, MACHO32_MAGICS, MACHO_MAGICS, find_in_fat, find_in_macho


#: compressed-stream magic -> tarfile's name for the compression.  TVM's own ``export_library("x.tar")``
#: runs ``tar -czf``, so its tars are gzip-compressed whatever the name says.
COMPRESSIONS = {b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}
#: deflate cannot expand data more than about 1032:1; bzip2 and xz members are held to the same
#: bound, so a small hostile file cannot make the loader allocate without limit
MAX_EXPANSION = 1032
NOT_A_LIBRARY = "not a TVM library: not ELF, Mach-O, tar or a raw blob"
_TAR_ERRORS = (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError)


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
    if magic[:2] == b"MZ":
        raise LoaderError("Windows PE/DLL at offset 0: not supported (expected ELF, Mach-O, tar "
                          "or a raw blob)")
    if len(data) >= 262 and bytes(data[257:262]) == b"ustar":
        return find_in_tar(data)
    compression = compression_of(data)
    if compression is not None:
        try:
            return find_in_tar(data, compression)
        except _NotATar:
            if not _raw_blob_fits(data):  # a raw blob whose length happens to spell the magic
                raise
    return find_raw(data)


def compression_of(data: memoryview) -> str | None:
    """"gz", "bz2" or "xz" when ``data`` starts with that compressor's magic, else None."""
    head = bytes(data[:6])
    return next((name for magic, name in COMPRESSIONS.items() if head.startswith(magic)), None)


def find_raw(data: memoryview) -> BlobLocation:
    """A raw blob file: the 8-byte length, then the blob.  A file that neither fits that nor starts
    like a blob is no library at all, and is reported as such rather than as a bad length."""
    if len(data) < HEADER:
        raise LoaderError(f"{NOT_A_LIBRARY} (a file of {len(data)} bytes; expected at least the "
                          f"8-byte blob length)")
    if not _raw_blob_fits(data) and not looks_like_blob(data[HEADER:]):
        raise LoaderError(f"{NOT_A_LIBRARY} (its first 8 bytes, {bytes(data[:HEADER]).hex(' ')}, are no "
                          f"blob length that fits the {len(data)}-byte file, and no module blob "
                          f"starts after them; expected a file written by export_library)")
    offset, size = read_header(data, 0, len(data), "raw blob file")
    return BlobLocation("raw", "any", offset, size, None)


def _raw_blob_fits(data: memoryview) -> bool:
    return len(data) >= HEADER and int.from_bytes(data[:HEADER], "little") <= len(data) - HEADER


class _NotATar(LoaderError):
    """The bytes are not a tar archive (or not a compressed one) at all."""


def _tar_members(data: memoryview, compression: str | None):
    """(name, file offset or None, bytes) of each regular member that may hold the blob: ELF and
    Mach-O objects and C sources.  Uncompressed members are views into ``data`` (no copy);
    compressed ones are decompressed one at a time, all of them together at most
    ``MAX_EXPANSION`` times the file."""
    what = f"{compression}-compressed tar" if compression else "tar file"
    budget = len(data) * MAX_EXPANSION
    try:
        tar = tarfile.open(fileobj=BytesReader(data), mode=f"r:{compression or ''}")
    except _TAR_ERRORS as exc:
        raise _NotATar(f"{NOT_A_LIBRARY} ({what} that does not open: {exc}; expected a tar written "
                       f"by export_library)") from None
    with tar:
        for count in itertools.count():
            try:
                m = tar.next()
                if m is None and count == 0:  # e.g. compressed zeros: tarfile sees an empty archive
                    raise _NotATar(f"{NOT_A_LIBRARY} ({what} that holds no member; expected a tar "
                                   f"written by export_library)")
                if m is None:
                    return
                if not m.isfile():
                    continue
                if compression is None:
                    start, end = m.offset_data, m.offset_data + m.size
                    if end > len(data):
                        raise LoaderError(f"tar member {m.name!r} at offset {start} runs past the end")
                    content = data[start:end]
                else:
                    start, f = None, tar.extractfile(m)
                    head = f.read(4)
                    if not _may_hold_blob(m.name, head):
                        continue
                    if m.size > budget:
                        raise LoaderError(f"{what}: member {m.name!r} of {m.size} bytes expands the "
                                          f"{len(data)}-byte file more than {MAX_EXPANSION} times")
                    budget -= m.size
                    content = memoryview(head + f.read())
            except LoaderError:
                raise
            except _TAR_ERRORS as exc:
                raise LoaderError(f"malformed {what} (expected a tar written by export_library): "
                                  f"{exc}") from None
            if _may_hold_blob(m.name, bytes(content[:4])):
                yield m.name, start, content


def _may_hold_blob(name: str, head: bytes) -> bool:
    return head == b"\x7fELF" or head in MACHO_MAGICS or name.endswith(".c")


def find_in_tar(data: memoryview, compression: str | None = None) -> BlobLocation:
    """Search the object members of an ``export_library`` tar (plain, or compressed with
    ``compression``: "gz", "bz2" or "xz") for the blob symbol."""
    tried, found, functions = [], None, set()
    for name, start, content in _tar_members(data, compression):
        tried.append(name)
        try:
            loc = find_in_c_source(content) if name.endswith(".c") else find_blob(content)
        except NoSymbol as exc:
            functions.update(exc.functions)
            continue
        except LoaderError as exc:  # offsets inside the member: say where the member starts
            where = f"data at file offset {start}" if start is not None else "offsets in the member"
            raise LoaderError(f"tar member {name!r} ({where}): {exc}") from None
        functions.update(loc.symbols)
        if found is None:
            if loc.buffer is None and start is None:
                loc.buffer = content.obj  # decompressed: the blob lives in the member's bytes
            elif loc.buffer is None:
                loc.offset += start
            loc.container = f"tar.{compression}" if compression else "tar"
            loc.member = name
            found = loc
    if found is not None:
        found.symbols = sorted(functions)
        return found
    raise LoaderError(f"tar file: no object member defines {BLOB_SYMBOL} or {FFI_BLOB_SYMBOL} "
                      f"(expected one in devc.o or another object member; searched "
                      f"{tried or 'no ELF/Mach-O members'})")
