"""Find the module blob inside a library file without loading it.

What the blob symbol holds (this is the contract with the client exporter)
--------------------------------------------------------------------------
Both layouts put the same shape of bytes behind their symbol, as TVM's ``PackImportsToC`` writes
it (``const unsigned char SYMBOL[8 + n] = {...}``, exported, in read-only data):

* bytes 0..8: ``n``, the blob's length, as a little-endian ``u64`` (on every target, also
  big-endian ones);
* bytes 8..8+n: the blob, ``build_blob(root, layout)``.

The symbol name tells the layout: ``__tvm_dev_mblob`` holds a classic (or legacy) blob,
``__tvm_ffi__library_bin`` a tvm-ffi blob.  Mach-O prefixes C symbols with ``_``.  A *raw blob
file* is exactly the symbol's content (8-byte length, then the blob; what TVM's
``ModulePackImportsToNDArray`` returns too), the layout read from the blob itself.

Containers
----------
* ELF (``\\x7fELF``), any class, byte order and machine, shared objects, executables and
  relocatable objects.  pyelftools reads headers, sections, symbol tables and, when the section
  headers are stripped, the dynamic segment's symbol table; we only map the symbol to file bytes
  (through its section, or the ``PT_LOAD`` segment holding its address) and check every bound.
* Mach-O 64-bit (``0xfeedfacf``), objects and dylibs: the headers are declared by macholib's
  ``mach_o`` structures; we walk the load commands ourselves (``LC_SEGMENT_64`` sections and
  ``LC_SYMTAB``) so that every offset is checked against the file before use.
* tar (``export_library("x.tar")``): each regular member that is an ELF or Mach-O object is
  searched in place (no extraction, no copy).
* anything else is taken as a raw blob file.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field

from macholib import mach_o

from .errors import LoaderError, ViewStream

BLOB_SYMBOL = "__tvm_dev_mblob"
FFI_BLOB_SYMBOL = "__tvm_ffi__library_bin"
#: symbol name -> layout family ("classic" covers the legacy layout too)
SYMBOL_LAYOUTS = {BLOB_SYMBOL: "classic", FFI_BLOB_SYMBOL: "ffi"}
HEADER = 8  # the u64 length in front of the blob


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


def _read_header(data: memoryview, at: int, limit: int, what: str) -> tuple[int, int]:
    """Check the 8-byte length at ``at`` and that the blob fits before ``limit``: (offset, size)."""
    if at < 0 or at + HEADER > limit:
        raise LoaderError(f"{what}: blob length header at offset {at} runs past the end "
                          f"(expected 8 bytes before offset {limit})")
    size = int.from_bytes(data[at:at + HEADER], "little")
    if size > limit - at - HEADER:
        raise LoaderError(f"{what}: blob size header at offset {at} says {size} bytes, but only "
                          f"{limit - at - HEADER} bytes follow (expected a size that fits)")
    return at + HEADER, size


def find_blob(data: memoryview) -> BlobLocation:
    """Locate the blob in a whole file's bytes, whatever the container."""
    magic = bytes(data[:4])
    if magic == b"\x7fELF":
        from .elf import find_in_elf

        return find_in_elf(data)
    if magic in (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf"):
        return find_in_macho(data)
    if magic in (b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xce"):
        raise LoaderError("32-bit Mach-O files are not supported (expected a 64-bit Mach-O)")
    if magic in (b"\xca\xfe\xba\xbe", b"\xbe\xba\xfe\xca"):
        raise LoaderError("universal (fat) Mach-O files are not supported; extract one "
                          "architecture with lipo -thin")
    if len(data) >= 262 and bytes(data[257:262]) == b"ustar":
        return find_in_tar(data)
    if len(data) < HEADER:
        raise LoaderError(f"file of {len(data)} bytes is no library and no raw blob "
                          f"(expected at least the 8-byte blob length)")
    offset, size = _read_header(data, 0, len(data), "raw blob file")
    return BlobLocation("raw", "any", offset, size, None)


def find_in_tar(data: memoryview) -> BlobLocation:
    """Search the object members of an ``export_library`` tar for the blob symbol."""
    try:
        with tarfile.open(fileobj=_BytesReader(data), mode="r:") as tar:
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
        if head != b"\x7fELF" and head not in (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf"):
            continue
        tried.append(m.name)
        try:
            loc = find_blob(data[start:end])
        except _NoSymbol as exc:
            functions.update(exc.functions)
            continue
        functions.update(loc.symbols)
        if found is None:
            loc.offset += start
            loc.container, loc.member = "tar", m.name
            found = loc
    if found is not None:
        found.symbols = sorted(functions)
        return found
    raise LoaderError(f"tar file: no object member defines {BLOB_SYMBOL} or {FFI_BLOB_SYMBOL} "
                      f"(expected one in devc.o or another object member; searched "
                      f"{tried or 'no ELF/Mach-O members'})")


class _NoSymbol(LoaderError):
    """The container is fine but holds neither blob symbol; ``functions`` are its functions."""

    functions: list[str] = []


def no_symbol(container: str, arch: str, functions: list[str] | None = None) -> _NoSymbol:
    exc = _NoSymbol(f"{container} ({arch}): no symbol {BLOB_SYMBOL} or {FFI_BLOB_SYMBOL} found "
                    f"(expected a library written by TVM's export_library or our exporter)")
    exc.functions = list(functions or [])
    return exc


class _BytesReader(ViewStream):
    """ViewStream whose reads return bytes (for parsers that expect ``bytes``)."""

    def read(self, size: int = -1):
        return bytes(super().read(size))

    def readinto(self, b) -> int:
        chunk = super(_BytesReader, self).read(len(b))
        b[:len(chunk)] = chunk
        return len(chunk)


# ---------------------------------------------------------------------------------------- Mach-O
_LC_SEGMENT_64 = 0x19
_LC_SYMTAB = 0x2
_N_STAB, _N_TYPE, _N_SECT, _N_EXT = 0xE0, 0x0E, 0x0E, 0x01


def find_in_macho(data: memoryview) -> BlobLocation:
    """Locate the blob in a 64-bit Mach-O object or dylib (symbols carry a leading ``_``)."""
    endian = "<" if bytes(data[:4]) == b"\xcf\xfa\xed\xfe" else ">"

    def struct_at(cls, offset: int, what: str):
        if offset < 0 or offset + cls._size_ > len(data):
            raise LoaderError(f"Mach-O: {what} at offset {offset} runs past the end of the "
                              f"{len(data)}-byte file (expected {cls._size_} bytes)")
        return cls.from_str(bytes(data[offset:offset + cls._size_]), _endian_=endian)

    hdr = struct_at(mach_o.mach_header_64, 0, "header")
    arch = mach_o.CPU_TYPE_NAMES.get(int(hdr.cputype), f"cputype {int(hdr.cputype)}")
    sections, symtab = [], None
    at, end = mach_o.mach_header_64._size_, mach_o.mach_header_64._size_ + int(hdr.sizeofcmds)
    for _ in range(int(hdr.ncmds)):
        lc = struct_at(mach_o.load_command, at, "load command")
        if int(lc.cmdsize) < mach_o.load_command._size_ or at + int(lc.cmdsize) > end:
            raise LoaderError(f"Mach-O: load command at offset {at} has size {int(lc.cmdsize)}, "
                              f"expected 8..{end - at}")
        if int(lc.cmd) == _LC_SEGMENT_64:
            seg = struct_at(mach_o.segment_command_64, at + 8, "segment command")
            base = at + 8 + mach_o.segment_command_64._size_
            for i in range(int(seg.nsects)):
                sections.append(struct_at(mach_o.section_64, base + i * mach_o.section_64._size_,
                                          "section header"))
        elif int(lc.cmd) == _LC_SYMTAB:
            symtab = struct_at(mach_o.symtab_command, at + 8, "symtab command")
        at += int(lc.cmdsize)
    if symtab is None:
        raise no_symbol("Mach-O", arch)
    str_end = int(symtab.stroff) + int(symtab.strsize)
    if str_end > len(data):
        raise LoaderError(f"Mach-O: string table at offset {int(symtab.stroff)} runs past the end")
    found, functions = None, []
    for i in range(int(symtab.nsyms)):
        sym = struct_at(mach_o.nlist_64, int(symtab.symoff) + i * 16, "symbol")
        ntype = int(sym.n_type)
        if ntype & _N_STAB or ntype & _N_TYPE != _N_SECT or not ntype & _N_EXT:
            continue
        name = _cstring(data, int(symtab.stroff) + int(sym.n_un), str_end)
        if name in ("_" + BLOB_SYMBOL, "_" + FFI_BLOB_SYMBOL) and found is None:
            found = (name[1:], sym)
        elif 0 < int(sym.n_sect) <= len(sections) and \
                bytes(sections[int(sym.n_sect) - 1].sectname).rstrip(b"\0") == b"__text":
            functions.append(name[1:] if name.startswith("_") else name)
    if found is None:
        raise no_symbol("Mach-O", arch, functions)
    name, sym = found
    if not 0 < int(sym.n_sect) <= len(sections):
        raise LoaderError(f"Mach-O: symbol {name} names section {int(sym.n_sect)}, "
                          f"expected 1..{len(sections)}")
    sect = sections[int(sym.n_sect) - 1]
    rel = int(sym.n_value) - int(sect.addr)
    sect_end = int(sect.offset) + int(sect.size)
    if rel < 0 or int(sect.offset) == 0 or sect_end > len(data):
        raise LoaderError(f"Mach-O: symbol {name} (address 0x{int(sym.n_value):x}) has no bytes in "
                          f"the file (expected it inside section {bytes(sect.sectname).rstrip(bytes(1))!r})")
    offset, size = _read_header(data, int(sect.offset) + rel, sect_end, f"Mach-O symbol {name}")
    return BlobLocation("macho", arch, offset, size, SYMBOL_LAYOUTS[name], name, functions)


def _cstring(data: memoryview, start: int, end: int) -> str:
    if not 0 <= start < end:
        return ""
    chunk = bytes(data[start:min(end, start + 4096)])
    return chunk.split(b"\0", 1)[0].decode("utf-8", "replace")

