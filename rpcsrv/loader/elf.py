"""Locate the blob symbol in an ELF file (any class, byte order, machine; .so, executable or .o).

pyelftools does the ELF decoding (32/64-bit, both byte orders, symbol tables, the dynamic
segment's hash tables when section headers are stripped): it is well kept and saves us from
re-declaring ELF.  Untrusted sizes are checked here before pyelftools walks anything they govern,
and every error it raises on a malformed file becomes a ``LoaderError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from elftools.elf.dynamic import DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from .errors import BytesReader, LoaderError
from .location import SYMBOL_LAYOUTS, BlobLocation, blob_symbol, no_symbol, read_header


def find_in_elf(data: memoryview) -> BlobLocation:
    """Locate the blob symbol (``.dynsym``/``.symtab``, else the dynamic segment)."""
    _check_header(data)
    try:
        return _find(data)
    except LoaderError:
        raise
    except Exception as exc:  # pyelftools signals malformed input with many exception types
        raise LoaderError(f"malformed ELF file (expected well-formed sections, segments and symbol "
                          f"tables): {type(exc).__name__}: {exc}") from None


def _check_header(data: memoryview) -> None:
    """Check the identification bytes and that the header tables lie inside the file."""
    if len(data) < 52:
        raise LoaderError(f"ELF file of {len(data)} bytes is shorter than an ELF header "
                          f"(expected at least 52 bytes at offset 0)")
    cls, order = data[4], data[5]
    if cls not in (1, 2) or order not in (1, 2):
        raise LoaderError(f"ELF identification: class {cls} at offset 4 and data encoding {order} at "
                          f"offset 5, expected 1 or 2 each")
    e = "<" if order == 1 else ">"
    if cls == 2:
        if len(data) < 64:
            raise LoaderError("ELF64 header runs past the end (expected 64 bytes at offset 0)")
        phoff, shoff = struct.unpack_from(e + "QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(e + "HHHHH", data, 0x36)
        want_ph, want_sh = 56, 64
    else:
        phoff, shoff = struct.unpack_from(e + "II", data, 0x1C)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(e + "HHHHH", data, 0x2A)
        want_ph, want_sh = 32, 40
    for what, off, entsize, want, num in (("program header table", phoff, phentsize, want_ph, phnum),
                                          ("section header table", shoff, shentsize, want_sh, shnum)):
        if num and (entsize != want or off + num * entsize > len(data)):
            raise LoaderError(f"ELF {what} at offset {off} ({num} entries of {entsize} bytes) does "
                              f"not fit the {len(data)}-byte file (expected {want}-byte entries "
                              f"inside the file)")
    if shnum and shstrndx >= shnum:
        raise LoaderError(f"ELF section name table index {shstrndx} is out of range "
                          f"(expected < {shnum})")


def _arch(elf) -> str:
    order = "le" if elf.little_endian else "be"
    return f"{elf.get_machine_arch()} ELF{elf.elfclass} {order}"


def _find(data: memoryview) -> BlobLocation:
    elf = ELFFile(BytesReader(data))
    arch = _arch(elf)
    tables = []
    if elf.num_sections():
        for sec in elf.iter_sections():
            if isinstance(sec, SymbolTableSection):
                _check_table(sec, len(data))
                tables.append(sec)
        tables.sort(key=lambda s: s.name != ".dynsym")
    if tables:
        return _from_sections(elf, data, tables, arch)
    return _from_segments(elf, data, arch)


def _check_table(sec, file_size: int) -> None:
    off, size, entsize = sec["sh_offset"], sec["sh_size"], sec["sh_entsize"]
    if entsize <= 0 or off + size > file_size:
        raise LoaderError(f"ELF: symbol table {sec.name!r} at offset {off} (size {size}, entry "
                          f"size {entsize}) does not fit the {file_size}-byte file (expected "
                          f"non-empty entries inside the file)")
    link = sec.stringtable
    if link["sh_offset"] + link["sh_size"] > file_size:
        raise LoaderError(f"ELF: string table of {sec.name!r} at offset {link['sh_offset']} (size "
                          f"{link['sh_size']}) does not fit the {file_size}-byte file (expected "
                          f"it inside the file)")


def _functions(symbols) -> list[str]:
    """Defined, non-local function names among pyelftools symbols (dynamic segment path)."""
    return sorted({s.name for s in symbols if s["st_info"]["type"] == "STT_FUNC"
                   and s["st_info"]["bind"] != "STB_LOCAL" and s["st_shndx"] != "SHN_UNDEF"
                   and s.name})


# Elf64_Sym and Elf32_Sym field layouts (the byte order is the file's)
_SYM_FIELDS = {
    64: [("name", "u4"), ("info", "u1"), ("other", "u1"), ("shndx", "u2"), ("value", "u8"), ("size", "u8")],
    32: [("name", "u4"), ("value", "u4"), ("size", "u4"), ("info", "u1"), ("other", "u1"), ("shndx", "u2")],
}
_STT_FUNC, _STB_LOCAL, _SHN_LORESERVE = 2, 0, 0xFF00


@dataclass
class _Symbol:
    name: str
    shndx: int
    value: int
    size: int


def _scan_table(elf, data: memoryview, sec) -> tuple[list[str], _Symbol | None]:
    """Read a symbol table with numpy (thousands of symbols in milliseconds): the host function
    names and the blob symbol, if this table defines it."""
    order = "<" if elf.little_endian else ">"
    dtype = np.dtype([(name, order + kind) for name, kind in _SYM_FIELDS[elf.elfclass]])
    if sec["sh_entsize"] != dtype.itemsize:
        raise LoaderError(f"ELF: symbol table {sec.name!r} at offset {sec['sh_offset']} has entries of "
                          f"{sec['sh_entsize']} bytes, expected {dtype.itemsize}")
    syms = np.frombuffer(data, dtype, count=sec["sh_size"] // dtype.itemsize, offset=sec["sh_offset"])
    link = sec.stringtable
    strings = bytes(data[link["sh_offset"]:link["sh_offset"] + link["sh_size"]])

    def name(i: int) -> str:
        start = int(syms["name"][i])
        stop = strings.find(b"\0", start)
        return strings[start:stop if stop >= 0 else len(strings)].decode("utf-8", "replace")

    kind, bind, defined = syms["info"] & 0xF, syms["info"] >> 4, syms["shndx"] != 0
    functions = sorted({name(i) for i in np.flatnonzero(defined & (kind == _STT_FUNC) & (bind != _STB_LOCAL))}
                       - {""})
    for i in np.flatnonzero(defined & (kind != _STT_FUNC)):
        text = name(i)
        if blob_symbol(text):
            sym = syms[i]
            return functions, _Symbol(text, int(sym["shndx"]), int(sym["value"]), int(sym["size"]))
    return functions, None


def _from_sections(elf, data: memoryview, tables, arch: str) -> BlobLocation:
    """Search .dynsym, then .symtab.  The host functions are listed from the first table that
    has any: for a shared object that is .dynsym, what ``dlsym`` (and so TVM) would see."""
    found, functions = None, []
    for table in tables:
        if found is not None and functions:
            break
        names, symbol = _scan_table(elf, data, table)
        functions = functions or names
        found = found or symbol
    if found is None:
        raise no_symbol("ELF", arch, functions)
    if not 0 < found.shndx < min(elf.num_sections(), _SHN_LORESERVE):
        raise LoaderError(f"ELF: symbol {found.name} has section index {found.shndx}, expected a "
                          f"section holding its bytes (1..{elf.num_sections() - 1})")
    sec = elf.get_section(found.shndx)
    if sec["sh_type"] == "SHT_NOBITS":
        raise LoaderError(f"ELF: symbol {found.name} lives in {sec.name!r} (section {found.shndx}), "
                          f"which has no file bytes (expected a data section such as .rodata)")
    start, end = sec["sh_offset"], sec["sh_offset"] + sec["sh_size"]
    if end > len(data):
        raise LoaderError(f"ELF: section {sec.name!r} (offset {start}, size {sec['sh_size']}) runs "
                          f"past the end of the {len(data)}-byte file")
    # in objects st_value is the offset in the section, elsewhere an address (sh_addr based)
    at = start + found.value - (0 if elf["e_type"] == "ET_REL" else sec["sh_addr"])
    if not start <= at < end:
        raise LoaderError(f"ELF: symbol {found.name} (value 0x{found.value:x}) maps to file "
                          f"offset {at}, expected inside its section {sec.name!r} ({start}..{end})")
    limit = end if not found.size else min(end, at + found.size)
    offset, size = read_header(data, at, limit, f"ELF symbol {found.name}")
    layout = SYMBOL_LAYOUTS[blob_symbol(found.name)]
    return BlobLocation("elf", arch, offset, size, layout, found.name, functions)


def _from_segments(elf, data: memoryview, arch: str) -> BlobLocation:
    """No section headers: read the dynamic symbol table and map addresses through PT_LOAD."""
    dyn = next((s for s in elf.iter_segments() if isinstance(s, DynamicSegment)), None)
    if dyn is None:
        raise no_symbol("ELF without section headers or dynamic segment", arch)
    count = dyn.num_symbols()
    if count * (16 if elf.elfclass == 32 else 24) > len(data):
        raise LoaderError(f"ELF: dynamic symbol table claims {count} symbols, more than the "
                          f"{len(data)}-byte file holds (expected a count that fits)")
    symbols = list(dyn.iter_symbols())
    found = next((s for s in symbols if blob_symbol(s.name) and s["st_shndx"] != "SHN_UNDEF"), None)
    if found is None:
        raise no_symbol("ELF", arch, _functions(symbols))
    addr = found["st_value"]
    for seg in elf.iter_segments():
        if seg["p_type"] != "PT_LOAD" or not seg["p_vaddr"] <= addr < seg["p_vaddr"] + seg["p_filesz"]:
            continue
        at = seg["p_offset"] + addr - seg["p_vaddr"]
        end = min(seg["p_offset"] + seg["p_filesz"], len(data))
        limit = end if not found["st_size"] else min(end, at + found["st_size"])
        offset, size = read_header(data, at, limit, f"ELF symbol {found.name}")
        layout = SYMBOL_LAYOUTS[blob_symbol(found.name)]
        return BlobLocation("elf", arch, offset, size, layout, found.name, _functions(symbols))
    raise LoaderError(f"ELF: symbol {found.name} at address 0x{addr:x} is in no loadable segment "
                      f"with file bytes (expected a PT_LOAD segment holding it)")
