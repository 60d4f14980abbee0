"""Which machine a library was built for, and whether this board can run it.

The ELF header says it (read with pyelftools, as the loader does): ``e_machine``, the class
(32/64-bit), the byte order and, where the ABI lives in ``e_flags``, the float ABI (ARM
hard/soft float, RISC-V float ABI, MIPS ABI).  The board is described by the same fields of the
running Python executable.  Used to choose what to load: the native shim and host libraries
(``rpcsrv.native``, which imports it as ``rpcsrv.native.machine``) and the executor's prebuilt kernels.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache

from elftools.elf.elffile import ELFFile


@dataclass(frozen=True)
class Machine:
    arch: str  # e.g. "x64", "ARM", "MIPS" (pyelftools' names)
    bits: int
    little_endian: bool
    float_abi: str  # e.g. "hard-float", "soft-float", "o32"; "" when the format does not say

    def __str__(self) -> str:
        text = f"{self.arch} ELF{self.bits} {'le' if self.little_endian else 'be'}"
        return text + (f" {self.float_abi}" if self.float_abi else "")

    def runs(self, other: "Machine") -> bool:
        """Whether code built for ``other`` runs on this machine."""
        if (self.arch, self.bits, self.little_endian) != (other.arch, other.bits, other.little_endian):
            return False
        return not (self.float_abi and other.float_abi and self.float_abi != other.float_abi)


_EF_ARM_HARD, _EF_ARM_SOFT = 0x400, 0x200
_EF_RISCV_FLOAT = {0: "soft-float", 2: "single-float", 4: "double-float", 6: "quad-float"}
_EF_MIPS_ABI = 0xF000
_MIPS_ABIS = {1: "o32", 2: "o64", 3: "eabi32", 4: "eabi64"}


def _float_abi(machine: str, flags: int) -> str:
    if machine == "EM_ARM":
        return "hard-float" if flags & _EF_ARM_HARD else "soft-float" if flags & _EF_ARM_SOFT else ""
    if machine == "EM_RISCV":
        return _EF_RISCV_FLOAT[flags & 0x6]
    if machine == "EM_MIPS":
        return _MIPS_ABIS.get((flags & _EF_MIPS_ABI) >> 12, "")
    return ""


def machine_of(stream) -> Machine:
    """The machine of an ELF file (a binary stream); ValueError when it is not ELF."""
    try:
        elf = ELFFile(stream)
    except Exception as exc:  # pyelftools raises several types on non-ELF input
        raise ValueError(f"not an ELF file: {exc}") from None
    header = elf.header
    return Machine(elf.get_machine_arch(), elf.elfclass, elf.little_endian,
                   _float_abi(header["e_machine"], header["e_flags"]))


@lru_cache(maxsize=1)
def board() -> Machine:
    """This board's machine (from the running interpreter's ELF header)."""
    for path in ("/proc/self/exe", sys.executable):
        try:
            with open(os.path.realpath(path), "rb") as f:
                return machine_of(f)
        except (OSError, ValueError):
            continue
    raise RuntimeError("cannot tell this board's machine: the Python executable is not an ELF file")
