"""The ``relax.VMExecutable`` module of a loaded library, checked before any machine runs it.

``VMExecutableRuntime`` checks the whole executable when the library is loaded: every instruction
decodes, every register, constant, function index and jump stays in range (``checks.py``), and every
packed function the code calls is either a VM builtin this board implements or a function of the
library's imports (a native kernel in ``_lib``, an ExampleJSON subgraph, ...).  A library that fails
any check is refused with the reason, before a VM exists.  Its functions are TVM's:
``vm_load_executable`` (a :class:`~rpcsrv.executor.vm.interpreter.VirtualMachine`), ``stats``,
``as_text``, ``has_function``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from ...loader.vm_executable import KIND_PACKED, VMExecutableModule, decode_instructions
from ...loader.vm_text import describe_constant, disassemble
from ..module import RuntimeModule
from .builtins import BUILTINS, VMError, is_builtin_name
from .checks import check_function
from .ffi import NativeKernel
from .interpreter import VirtualMachine
from .registers import Tensor, as_tensor, host_function

Lookup = Callable[[str], Optional[Callable[..., Any]]]


class VMExecutableRuntime(RuntimeModule):
    """A ``relax.VMExecutable``, checked at load; ``vm_load_executable`` makes a machine for it."""

    type_key = "relax.VMExecutable"

    def __init__(self, exe: VMExecutableModule, imports: Optional[list[RuntimeModule]] = None,
                 kernels: Optional[Lookup] = None):
        super().__init__(imports)
        self.kernels = kernels
        self.by_name = {f.name: i for i, f in enumerate(exe.functions)}
        try:
            self.code = decode_instructions(exe)
        except ValueError as exc:
            raise VMError(f"relax.VMExecutable: {exc}") from None
        for index, f in enumerate(exe.functions):
            check_function(exe, self.code, index)
        missing = [f.name for f in exe.functions if f.kind == KIND_PACKED and self.resolve(f.name) is None]
        native = [name for name in missing if self._native_symbol(name)]
        if native:
            raise VMError(f"relax.VMExecutable: kernel(s) {', '.join(native)} are native code of the library, "
                          f"and native code is not enabled for this module tree (rpcsrv serve --no-native, or "
                          f"built without rpcsrv.native)")
        if missing:
            raise VMError(f"relax.VMExecutable: function(s) {', '.join(missing)} called by the code are neither "
                          f"VM builtins available on this board nor functions of the library")
        # the code and constants are copied out of the library file (tensors to ALIGNMENT-aligned
        # memory, as kernels require), so the file's mapping is released with the loaded library;
        # every VM of this executable shares these constants, as TVM's do on the CPU
        self.constants = [as_tensor(np.array(c)) if isinstance(c, np.ndarray) else c for c in exe.constants]
        self.exe = dataclasses.replace(exe, constants=[],  # see self.constants
                                       instr_offset=np.array(exe.instr_offset), instr_data=np.array(exe.instr_data))

    def resolve(self, name: str) -> Optional[Callable[..., Any]]:
        """The packed function ``name``: a builtin, else the imports' function (TVM's lookup order
        is imports first, then global functions; builtin names never clash with kernels)."""
        if name in BUILTINS:
            return BUILTINS[name]
        if is_builtin_name(name):
            return None
        if self.kernels is not None:
            fn = self.kernels(name)
            if fn is not None:
                return fn if isinstance(fn, NativeKernel) else host_function(fn)
        for mod in self.imports:
            for sub in mod.walk():
                if getattr(sub, "symbols", None) is not None or getattr(sub, "library", None) is not None:
                    continue  # a host library: its kernels come through ``kernels``
                fn = sub.get_function(name)
                if fn is not None:
                    return host_function(fn)
        return None

    def _native_symbol(self, name: str) -> bool:
        return any(f"__tvm_ffi_{name}" in (getattr(sub, "symbols", None) or ())
                   for mod in self.imports for sub in mod.walk())

    def get_function(self, name: str):
        if name == "vm_load_executable":
            return lambda: VirtualMachine(self)
        if name == "has_function":
            return lambda fname: fname in self.by_name
        if name == "as_text":
            return lambda: "\n".join(disassemble(self.exe))
        if name == "stats":
            return self.stats
        return None

    def stats(self) -> str:
        consts = ", ".join(describe_constant(c.array if isinstance(c, Tensor) else c) for c in self.constants)
        names = ", ".join(f.name for f in self.exe.functions)
        return (f"Relax VM executable statistics:\n  Constant pool (# {len(self.constants)}): [{consts}]\n"
                f"  Globals (#{len(self.exe.functions)}): [{names}]\n")


__all__ = ["VMExecutableRuntime"]
