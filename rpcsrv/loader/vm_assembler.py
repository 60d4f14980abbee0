"""Writing Relax VM executables without TVM: an assembler for bytecode functions.

Used by the client (``byoc compile --executor relax``) and by tests; the result is a
``VMExecutableModule`` that the loader's declaration serializes like any executable."""

from __future__ import annotations

from typing import Any

import numpy as np

from .vm_executable import (
    ARG_CONST, ARG_IMMEDIATE, ARG_REGISTER, KIND_PACKED, KIND_VM, OP_CALL, OP_RET, VM_REGISTER, VOID_REGISTER,
    VMExecutableModule, VMFunction, make_arg,
)


class Assembler:
    """Writes a ``VMExecutableModule``: bytecode functions calling packed functions by name.

    ``function(name, params)`` returns a ``FunctionWriter`` whose ``call`` and ``ret`` emit
    instructions; arguments are made with ``reg``, ``imm``, ``const`` (constants are pooled once
    each; arrays always get their own entry) and ``VM``.  ``build()`` gives the module (what a
    client exports without TVM, e.g. ``byoc compile --executor relax``).
    """

    VM = make_arg(ARG_REGISTER, VM_REGISTER)
    VOID = make_arg(ARG_REGISTER, VOID_REGISTER)

    def __init__(self):
        self.functions: list[VMFunction] = []
        self.index: dict[str, int] = {}
        self.constants: list[Any] = []
        self._const_index: dict[tuple, int] = {}
        self.offsets: list[int] = []
        self.words: list[int] = []

    def packed(self, name: str) -> int:
        """The function table index of packed function ``name`` (added on first use)."""
        if name not in self.index:
            self.index[name] = len(self.functions)
            self.functions.append(VMFunction(KIND_PACKED, name, num_args=-2))
        return self.index[name]

    def const(self, value: Any) -> int:
        """An argument word for constant ``value``."""
        key = None if isinstance(value, np.ndarray) else (type(value).__name__, value)
        if key is not None and key in self._const_index:
            return make_arg(ARG_CONST, self._const_index[key])
        self.constants.append(value)
        if key is not None:
            self._const_index[key] = len(self.constants) - 1
        return make_arg(ARG_CONST, len(self.constants) - 1)

    @staticmethod
    def reg(r: int) -> int:
        return make_arg(ARG_REGISTER, r)

    @staticmethod
    def imm(v: int) -> int:
        return make_arg(ARG_IMMEDIATE, v)

    def function(self, name: str, params: list[str]) -> "FunctionWriter":
        return FunctionWriter(self, name, list(params))

    def build(self) -> VMExecutableModule:
        return VMExecutableModule(list(self.functions), list(self.constants), np.asarray(self.offsets, "<i8"),
                                  np.asarray(self.words, "<i8"))


class FunctionWriter:
    """One bytecode function being written; registers 0.. are its parameters, ``new_reg`` adds one."""

    def __init__(self, asm: Assembler, name: str, params: list[str]):
        self.asm, self.name, self.params = asm, name, params
        self.start = len(asm.offsets)
        self.registers = len(params)
        asm.index[name] = len(asm.functions)
        asm.functions.append(VMFunction(KIND_VM, name))  # completed by ``end``

    def new_reg(self) -> int:
        self.registers += 1
        return self.registers - 1

    def call(self, func: str, *args: int, dst: int | None = None) -> int | None:
        """Emit ``dst = func(*args)`` (``dst`` None: the result is dropped)."""
        a = self.asm
        a.offsets.append(len(a.words))
        a.words += [OP_CALL, VOID_REGISTER if dst is None else dst, a.packed(func), len(args), *args]
        return dst

    def ret(self, r: int) -> None:
        self.asm.offsets.append(len(self.asm.words))
        self.asm.words += [OP_RET, r]

    def end(self) -> None:
        a = self.asm
        a.functions[a.index[self.name]] = VMFunction(KIND_VM, self.name, self.start, len(a.offsets),
                                                     len(self.params), self.registers, tuple(self.params))
