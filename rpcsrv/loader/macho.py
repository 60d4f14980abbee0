"""Locate the blob symbol in a 64-bit Mach-O file (object or dylib) or a universal (fat) file.

macholib declares the Mach-O structures (``mach_o.mach_header_64``, ``section_64``, ``nlist_64``
...), so we do not re-declare them; we walk the load commands ourselves because macholib's
``MachO`` reader wants a file name and trusts the offsets it reads, while every offset here is
checked against the bytes we have before it is used.
"""

from __future__ import annotations

import struct

from macholib import mach_o

from .errors import LoaderError
from .location import SYMBOL_LAYOUTS, BlobLocation, NoSymbol, blob_symbol, no_symbol, read_header

MACHO_MAGICS = (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf")  # 64-bit, little and big endian
MACHO32_MAGICS = (b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xce")  # 32-bit: not supported
FAT_MAGICS = (b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf")  # universal, 32- and 64-bit entries

_LC_SEGMENT_64 = 0x19
_LC_SYMTAB = 0x2
_N_STAB, _N_TYPE, _N_SECT, _N_EXT = 0xE0, 0x0E, 0x0E, 0x01


def find_in_macho(data: memoryview) -> BlobLocation:
    """Locate the blob in a 64-bit Mach-O object or dylib (symbols carry a leading ``_``)."""
    endian = "<" if bytes(data[:4]) == MACHO_MAGICS[0] else ">"

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
    if int(symtab.symoff) + 16 * int(symtab.nsyms) > len(data):
        raise LoaderError(f"Mach-O: {int(symtab.nsyms)} symbols at offset {int(symtab.symoff)} run "
                          f"past the end of the {len(data)}-byte file (expected 16 bytes each)")
    str_end = int(symtab.stroff) + int(symtab.strsize)
    if str_end > len(data):
        raise LoaderError(f"Mach-O: string table at offset {int(symtab.stroff)} (size "
                          f"{int(symtab.strsize)}) runs past the end of the {len(data)}-byte file")
    found, functions = None, []
    for i in range(int(symtab.nsyms)):
        sym = struct_at(mach_o.nlist_64, int(symtab.symoff) + i * 16, "symbol")
        ntype = int(sym.n_type)
        if ntype & _N_STAB or ntype & _N_TYPE != _N_SECT or not ntype & _N_EXT:
            continue
        name = _cstring(data, int(symtab.stroff) + int(sym.n_un), str_end)
        if blob_symbol(name) and found is None:
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
        section = bytes(sect.sectname).rstrip(b"\0").decode("ascii", "replace")
        raise LoaderError(f"Mach-O: symbol {name} (address 0x{int(sym.n_value):x}) has no bytes in "
                          f"the file (expected it inside section {section} at offset "
                          f"{int(sect.offset)}, size {int(sect.size)})")
    offset, size = read_header(data, int(sect.offset) + rel, sect_end, f"Mach-O symbol {name}")
    return BlobLocation("macho", arch, offset, size, SYMBOL_LAYOUTS[blob_symbol(name)], name,
                        functions)


def _cstring(data: memoryview, start: int, end: int) -> str:
    if not 0 <= start < end:
        return ""
    chunk = bytes(data[start:min(end, start + 4096)])
    return chunk.split(b"\0", 1)[0].decode("utf-8", "replace")


def find_in_fat(data: memoryview) -> BlobLocation:
    """Search each architecture slice of a universal file; the first slice holding the blob wins
    (every slice carries the same module tree), its functions are listed."""
    is64 = bytes(data[:4]) == FAT_MAGICS[1]
    if len(data) < 8:
        raise LoaderError("universal Mach-O header runs past the end (expected 8 bytes at offset 0)")
    (count,) = struct.unpack_from(">I", data, 4)
    entry = 32 if is64 else 20
    if 8 + count * entry > len(data):
        raise LoaderError(f"universal Mach-O: {count} architectures at offset 8 do not fit the "
                          f"{len(data)}-byte file (expected {entry} bytes each)")
    slices = []
    for i in range(count):
        at = 8 + i * entry
        cputype, _, offset, size = struct.unpack_from(">iiQQ" if is64 else ">iiII", data, at)
        if offset + size > len(data):
            raise LoaderError(f"universal Mach-O: slice {i} at offset {offset} (size {size}) runs "
                              f"past the end of the {len(data)}-byte file")
        slices.append((mach_o.CPU_TYPE_NAMES.get(cputype, f"cputype {cputype}"), offset, size))
    archs = ", ".join(name for name, _, _ in slices)
    for name, offset, size in slices:
        if bytes(data[offset:offset + 4]) not in MACHO_MAGICS:
            continue
        try:
            loc = find_in_macho(data[offset:offset + size])
        except NoSymbol:
            continue
        loc.offset += offset
        loc.arch = f"universal ({archs}); blob read from {loc.arch}"
        return loc
    raise no_symbol("universal Mach-O", archs)
