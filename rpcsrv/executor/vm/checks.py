"""Load-time checks of a Relax VM executable's code: nothing it does can leave its bounds.

Run once per function when the library is loaded, so that the interpreter's hot loop needs no
range checks and a corrupted executable is refused with the instruction and the reason."""

from __future__ import annotations

from ...loader.vm_executable import (
    ARG_CONST, ARG_FUNC, ARG_IMMEDIATE, ARG_REGISTER, KIND_PACKED, KIND_VM, KIND_VMTIR, OP_CALL, OP_GOTO, OP_IF,
    OP_RET, VM_REGISTER, VOID_REGISTER, VMExecutableModule,
)
from .builtins import VMError


def check_function(exe: VMExecutableModule, code: list, index: int) -> None:
    """Raise VMError when function ``index`` could index outside its registers, the constants,
    the function table or its own code."""
    f = exe.functions[index]
    where = f"relax.VMExecutable: function {f.name!r}"
    if f.kind == KIND_PACKED:
        return
    if f.kind == KIND_VMTIR:
        raise VMError(f"{where} is a VM TIR function (compiled with exec_mode='compiled'); this board runs "
                      f"bytecode functions only (compile with the default exec_mode='bytecode')")
    if f.kind != KIND_VM:
        raise VMError(f"{where} has unknown kind {f.kind} (expected 0 packed, 1 bytecode or 2 TIR)")
    if not 0 <= f.start_instr < f.end_instr <= len(code):
        raise VMError(f"{where}: instructions {f.start_instr}..{f.end_instr} are outside the code "
                      f"(0..{len(code)})")
    if not 0 <= f.num_args <= f.register_file_size or f.register_file_size > 1 << 20:
        raise VMError(f"{where}: {f.num_args} arguments do not fit its {f.register_file_size} registers")
    nregs, nconst, nfunc = f.register_file_size, len(exe.constants), len(exe.functions)

    def reg_ok(r: int, write: bool = False) -> bool:
        return 0 <= r < nregs or r == VOID_REGISTER or (r == VM_REGISTER and not write)

    for pc in range(f.start_instr, f.end_instr):
        ins, at = code[pc], f"{where}, instruction {pc}"
        if ins.op == OP_CALL:
            if not 0 <= ins.func < nfunc:
                raise VMError(f"{at}: calls function index {ins.func}, the table has {nfunc}")
            if not reg_ok(ins.dst, write=True):
                raise VMError(f"{at}: result register {ins.dst} outside its {nregs} registers")
            for kind, value in ins.args:
                ok = {ARG_REGISTER: lambda v: reg_ok(v), ARG_IMMEDIATE: lambda v: True,
                      ARG_CONST: lambda v: 0 <= v < nconst, ARG_FUNC: lambda v: 0 <= v < nfunc}.get(kind)
                if ok is None:
                    raise VMError(f"{at}: argument of unknown kind {kind}")
                if not ok(value):
                    raise VMError(f"{at}: argument {value} of kind {kind} out of range")
        elif ins.op in (OP_GOTO, OP_IF):
            if not f.start_instr <= pc + ins.offset < f.end_instr or (ins.op == OP_IF and ins.offset <= 1):
                raise VMError(f"{at}: jump by {ins.offset} leaves the function")
            if ins.op == OP_IF and not reg_ok(ins.reg):
                raise VMError(f"{at}: condition register {ins.reg} outside its {nregs} registers")
        elif ins.op == OP_RET and not reg_ok(ins.reg):
            raise VMError(f"{at}: result register {ins.reg} outside its {nregs} registers")
