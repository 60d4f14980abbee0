"""The Relax VM executable as text: disassembly (TVM's ``as_text`` layout) and what ``rpcsrv
inspect`` shows (functions with their signatures, the kernels and builtins each calls, constants).

Signatures come from the error-context strings the compiler stores for argument checks (they
carry each parameter's Relax annotation, e.g. ``R.Tensor((1, 3), dtype="float32")``)."""

from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np

from ..protocol.dtypes import DataType, dtype_str
from .vm_executable import (
    ARG_CONST, ARG_FUNC, ARG_IMMEDIATE, ARG_REGISTER, KIND_PACKED, KIND_VM, OP_CALL, OP_GOTO, OP_RET,
    VM_REGISTER, VOID_REGISTER, ShapeTuple, VMExecutableModule, VMFunction, decode_instructions,
)


def _reg(r: int) -> str:
    return {VOID_REGISTER: "%void", VM_REGISTER: "%vm"}.get(r, f"%{r}")


def format_arg(exe: VMExecutableModule, kind: int, value: int) -> str:
    if kind == ARG_REGISTER:
        return _reg(value)
    if kind == ARG_IMMEDIATE:
        return f"i{value}"
    if kind == ARG_CONST:
        return f"c[{value}]"
    if kind == ARG_FUNC:
        name = exe.functions[value].name if 0 <= value < len(exe.functions) else f"?{value}"
        return f"f[{name}]"
    return f"?kind{kind}({value})"


def disassemble(exe: VMExecutableModule) -> Iterator[str]:
    """The code as text, one line per instruction (the layout of TVM's ``as_text``)."""
    try:
        code = decode_instructions(exe)
    except ValueError as exc:
        yield f"(code not decodable: {exc})"
        return
    for f in exe.functions:
        if f.kind != KIND_VM:
            continue
        yield f"@{f.name}({', '.join(f.param_names)}):  {f.register_file_size} registers"
        for pc in range(max(f.start_instr, 0), min(f.end_instr, len(code))):
            ins = code[pc]
            if ins.op == OP_CALL:
                name = exe.functions[ins.func].name if 0 <= ins.func < len(exe.functions) else f"?{ins.func}"
                args = ", ".join(format_arg(exe, k, v) for k, v in ins.args)
                yield f"  {pc:4d}  call  {name:<28} in: {args:<24} dst: {_reg(ins.dst)}"
            elif ins.op == OP_RET:
                yield f"  {pc:4d}  ret   {_reg(ins.reg)}"
            elif ins.op == OP_GOTO:
                yield f"  {pc:4d}  goto  {ins.offset:+d}"
            else:
                yield f"  {pc:4d}  if    {_reg(ins.reg)}, else {ins.offset:+d}"


def describe_constant(c: Any) -> str:
    if isinstance(c, np.ndarray):
        return f"tensor {dtype_str(c.dtype)}{list(c.shape)} {c.nbytes} bytes"
    if isinstance(c, ShapeTuple):
        return f"shape {list(c)}"
    if isinstance(c, str):
        text = c if len(c) <= 60 else c[:57] + "..."
        return f"string {text!r}"
    if isinstance(c, DataType):
        return f"dtype {c}"
    return f"{type(c).__name__} {c}"


def called_functions(exe: VMExecutableModule) -> dict[str, list[str]]:
    """For each VM function, the packed functions (kernels, builtins) its code calls, in order."""
    try:
        code = decode_instructions(exe)
    except ValueError:
        return {}
    out = {}
    for f in exe.functions:
        if f.kind != KIND_VM:
            continue
        names: list[str] = []
        for ins in code[max(f.start_instr, 0):min(f.end_instr, len(code))]:
            targets = [ins.func] if ins.op == OP_CALL else []
            targets += [v for k, v in ins.args if k == ARG_FUNC]
            for t in targets:
                if 0 <= t < len(exe.functions) and exe.functions[t].name not in names:
                    names.append(exe.functions[t].name)
        out[f.name] = names
    return out


def constant_bytes(exe: VMExecutableModule) -> int:
    return int(sum(c.nbytes for c in exe.constants if isinstance(c, np.ndarray)))




_ERROR_CONTEXT = re.compile(r"ErrorContext\(fn=(?P<fn>[^,]+), loc=param\[(?P<i>\d+)\], param=(?P<p>[^,]+), "
                            r"annotation=(?P<a>.*)\)\s*$", re.S)


def param_annotations(exe: VMExecutableModule) -> dict[tuple[str, int], str]:
    """(function, parameter index) -> its Relax annotation, from the error-context strings the
    compiler puts in the constant pool for argument checks (e.g. ``R.Tensor((1, 3), dtype="float32")``)."""
    out = {}
    for c in exe.constants:
        m = _ERROR_CONTEXT.match(c) if isinstance(c, str) else None
        if m:
            out[(m["fn"], int(m["i"]))] = m["a"]
    return out


def _signature(f: VMFunction, notes: dict) -> list[str]:
    return [f"{p}: {notes[(f.name, i)]}" if (f.name, i) in notes else p for i, p in enumerate(f.param_names)]


def summarize_vm(exe: VMExecutableModule) -> dict:
    """What ``rpcsrv inspect`` shows of an executable (JSON-serialisable)."""
    calls = called_functions(exe)
    notes = param_annotations(exe)
    return {
        "version": exe.version,
        "functions": [{"name": f.name, "kind": f.kind_name, "params": _signature(f, notes),
                       "registers": f.register_file_size, "instructions": max(f.end_instr - f.start_instr, 0),
                       "calls": calls.get(f.name, [])} for f in exe.functions if f.kind != KIND_PACKED],
        "packed_functions": [f.name for f in exe.functions if f.kind == KIND_PACKED],
        "constants": [describe_constant(c) for c in exe.constants],
        "constant_bytes": constant_bytes(exe),
        "disassembly": list(disassemble(exe)),
    }


def format_vm(head: str, vm: dict, disasm: bool = False) -> list[str]:
    """Text lines for ``summarize_vm``'s summary (the disassembly only when asked)."""
    out = [f"{head}: Relax VM executable (version {vm['version']}), {len(vm['functions'])} function(s), "
           f"{len(vm['constants'])} constant(s) ({vm['constant_bytes']} tensor bytes)"]
    for f in vm["functions"]:
        out.append(f"  {f['kind']} {f['name']}({', '.join(f['params'])}): {f['registers']} registers, "
                   f"{f['instructions']} instructions")
        builtins = [c for c in f["calls"] if c.startswith("vm.")]
        kernels = [c for c in f["calls"] if not c.startswith("vm.")]
        if kernels:
            out.append(f"    kernels: {', '.join(kernels)}")
        if builtins:
            out.append(f"    builtins: {', '.join(builtins)}")
    for i, c in enumerate(vm["constants"]):
        out.append(f"  c[{i}]: {c}")
    if disasm:
        out.extend(f"  {line}" for line in vm["disassembly"])
    return out
