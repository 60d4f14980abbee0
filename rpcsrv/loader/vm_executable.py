"""The Relax VM executable (type key ``relax.VMExecutable``), declared once: parse and build.

What ``tvm.compile(relax_module, target)`` exports (TVM >= 0.21; facts from TVM's
``src/runtime/vm/executable.cc``, ``include/tvm/runtime/vm/executable.h`` and ``bytecode.h``).
The payload is one dmlc stream, little-endian:

* header: ``u64`` magic (``0xD225DE2F4214151D``, or ``...1E`` for version 2 which adds the memory
  scope section), then the VM version string (``"0.14"``);
* function table: ``u64`` count, then per function ``i32`` kind (0 packed function, 1 VM bytecode
  function, 2 VM TIR function), name, ``i64`` start and end instruction, ``i64`` argument count,
  ``i64`` register file size, and the parameter names (a string vector);
* memory scopes (version 2 only): ``u64`` count, then ``i64`` constant index and scope string;
* constant pool: ``u64`` count, then per constant an ``i32`` tvm-ffi type index and its value:
  Tensor (70: an NDArray as in param dicts), Shape (69: ``u64`` count, ``i64`` dims), string
  (65: ``u64`` length, bytes), int (1: ``i64``), float (3: ``f64``), DataType (5: DLDataType);
* code: instruction offsets (``u64`` count, ``i64`` each), then the instruction words (same).

Instructions (words of ``instr_data`` starting at ``instr_offset[i]``): ``Call`` = 1, dst
register, function index, argument count, the arguments; ``Ret`` = 2, result register;
``Goto`` = 3, pc offset; ``If`` = 4, condition register, false offset.  An argument word holds
its kind in the top 8 bits (0 register, 1 immediate, 2 constant index, 3 function index) and a
56-bit signed value below.  Registers from ``2**54`` up are special: void (``2**54``) and the VM
itself (``2**54 + 1``).

Instruction words and shapes are parsed as numpy ``int64`` views over the payload (no per-word
Python objects); ``decode_instructions`` turns the code into tuples, checking every field.
``vm_text.py`` disassembles and summarizes an executable (``rpcsrv inspect``), ``vm_assembler.py``
writes one without TVM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from construct import (
    Construct, Float64l, If, Int8ul, Int16ul, Int32sl, Int64sl, Int64ul, Struct, Switch, stream_read, this,
)

from ..protocol.dtypes import DataType
from .formats import DmlcString, NDArray, StringVector, Vector, _remaining, fail
from .node import ModuleNode, PayloadCodec
from .plugins import ModuleKind, RuntimePlugin

MAGIC_V1 = 0xD225DE2F4214151D
MAGIC_V2 = 0xD225DE2F4214151E
VM_VERSION = "0.14"

#: function kinds (``VMFuncInfo::FuncKind``)
KIND_PACKED, KIND_VM, KIND_VMTIR = 0, 1, 2
KIND_NAMES = {KIND_PACKED: "packed_func", KIND_VM: "vm_func", KIND_VMTIR: "vm_tir_func"}

#: opcodes (``Opcode``)
OP_CALL, OP_RET, OP_GOTO, OP_IF = 1, 2, 3, 4
#: argument kinds (``Instruction::ArgKind``)
ARG_REGISTER, ARG_IMMEDIATE, ARG_CONST, ARG_FUNC = 0, 1, 2, 3
VALUE_BITS = 56
BEGIN_SPECIAL_REG = 1 << 54
VOID_REGISTER = BEGIN_SPECIAL_REG
VM_REGISTER = BEGIN_SPECIAL_REG + 1

#: tvm-ffi type indices of constant pool entries (``tvm/ffi/c_api.h``)
T_INT, T_FLOAT, T_DATATYPE, T_STR, T_SHAPE, T_TENSOR = 1, 3, 5, 65, 69, 70


class ShapeTuple(tuple):
    """A ``ffi::Shape`` (tuple of ints); a type of its own so that it is not taken for a tuple."""

    def __repr__(self) -> str:
        return f"Shape{tuple(self)}"


class I64Array(Construct):
    """dmlc vector of ``i64``: ``u64`` count, then the words; parses to a read-only int64 view."""

    def _parse(self, stream, context, path):
        start = stream.tell()
        n = Int64ul._parsereport(stream, context, path)
        if n * 8 > _remaining(stream):
            fail(stream, start, f"array of {n} int64 words cannot fit in the {_remaining(stream)} bytes left")
        return np.frombuffer(stream_read(stream, 8 * n, path), dtype="<i8")

    def _build(self, obj, stream, context, path):
        arr = np.ascontiguousarray(obj, dtype="<i8")
        stream.write(Int64ul.build(arr.size))
        stream.write(arr.tobytes())
        return obj


class RawString(Construct):
    """A string constant: ``u64`` length, then bytes (kept as text, invalid UTF-8 replaced)."""

    def _parse(self, stream, context, path):
        start = stream.tell()
        n = Int64ul._parsereport(stream, context, path)
        if n > _remaining(stream):
            fail(stream, start, f"string constant of length {n} runs past the end")
        return bytes(stream_read(stream, n, path)).decode("utf-8", "replace")

    def _build(self, obj, stream, context, path):
        data = obj.encode("utf-8")
        stream.write(Int64ul.build(len(data)))
        stream.write(data)
        return obj


class UnknownConstant(Construct):
    """Switch default: a constant type the format does not define."""

    def _parse(self, stream, context, path):
        fail(stream, stream.tell() - 4, f"constant pool entry of unknown type index {context.type_index} "
                                        f"(expected Tensor, Shape, string, int, float or DataType)")

    def _build(self, obj, stream, context, path):
        raise ValueError(f"cannot write a constant of type index {context.type_index}")


I64Words = I64Array()

FuncInfo = Struct(
    "kind" / Int32sl,
    "name" / DmlcString,
    "start_instr" / Int64sl,
    "end_instr" / Int64sl,
    "num_args" / Int64sl,
    "register_file_size" / Int64sl,
    "param_names" / StringVector,
)

DLDataTypeStruct = Struct("code" / Int8ul, "bits" / Int8ul, "lanes" / Int16ul)

Constant = Struct(
    "type_index" / Int32sl,
    "value" / Switch(this.type_index, {
        T_TENSOR: NDArray, T_SHAPE: I64Words, T_STR: RawString(), T_INT: Int64sl, T_FLOAT: Float64l,
        T_DATATYPE: DLDataTypeStruct,
    }, default=UnknownConstant()),
)

MemoryScope = Struct("const_index" / Int64sl, "scope" / DmlcString)

#: the whole ``relax.VMExecutable`` payload
VMExecutablePayload = Struct(
    "magic" / Int64ul,
    "version" / DmlcString,
    "functions" / Vector(FuncInfo, min_size=4 + 8 + 32 + 8),
    "memory_scopes" / If(this.magic == MAGIC_V2, Vector(MemoryScope, min_size=16)),
    "constants" / Vector(Constant, min_size=4),
    "instr_offset" / I64Words,
    "instr_data" / I64Words,
)


@dataclass(frozen=True)
class VMFunction:
    """One entry of the function table."""

    kind: int
    name: str
    start_instr: int = 0
    end_instr: int = 0
    num_args: int = 0
    register_file_size: int = 0
    param_names: tuple[str, ...] = ()

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, f"kind{self.kind}")


@dataclass(eq=False, repr=False)
class VMExecutableModule(ModuleNode):
    """A decoded ``relax.VMExecutable``: functions, constants and code (not yet checked as code).

    Constants are numpy arrays (tensors, read-only views over the file), ``ShapeTuple``, ``str``,
    ``int``, ``float`` or ``DataType``.  ``memory_scopes`` maps constant indices to scopes.
    """

    functions: list[VMFunction]
    constants: list[Any]
    instr_offset: np.ndarray
    instr_data: np.ndarray
    memory_scopes: dict[int, str] = field(default_factory=dict)
    version: str = VM_VERSION
    magic: int = MAGIC_V2
    type_key: str = field(default="relax.VMExecutable", kw_only=True)

    def function(self, name: str) -> VMFunction | None:
        return next((f for f in self.functions if f.name == name), None)


def _constant_value(c) -> Any:
    t, v = c.type_index, c.value
    if t == T_SHAPE:
        return ShapeTuple(int(d) for d in v)
    if t == T_DATATYPE:
        return DataType(v.code, v.bits, v.lanes)
    return v


def _constant_entry(v: Any) -> dict:
    if isinstance(v, np.ndarray):
        return dict(type_index=T_TENSOR, value=v)
    if isinstance(v, ShapeTuple):
        return dict(type_index=T_SHAPE, value=np.asarray(v, dtype="<i8"))
    if isinstance(v, str):
        return dict(type_index=T_STR, value=v)
    if isinstance(v, DataType):
        return dict(type_index=T_DATATYPE, value=dict(code=v.code, bits=v.bits, lanes=v.lanes))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"a VM constant cannot be a {type(v).__name__}")
    return dict(type_index=T_INT if isinstance(v, int) else T_FLOAT, value=v)


def decode(v, key: str) -> VMExecutableModule:
    """Parsed payload -> module (checks magic and version; the code is checked by the executor)."""
    if v.magic not in (MAGIC_V1, MAGIC_V2):
        raise ValueError(f"bad VM executable magic 0x{v.magic:016X}, expected 0x{MAGIC_V2:016X} "
                         f"or 0x{MAGIC_V1:016X}")
    if v.version != VM_VERSION:
        raise ValueError(f"VM executable version {v.version!r}, this board reads {VM_VERSION!r}")
    funcs = [VMFunction(f.kind, f.name, f.start_instr, f.end_instr, f.num_args, f.register_file_size,
                        tuple(f.param_names)) for f in v.functions]
    scopes = {int(s.const_index): s.scope for s in v.memory_scopes} if v.magic == MAGIC_V2 else {}
    return VMExecutableModule(funcs, [_constant_value(c) for c in v.constants], v.instr_offset,
                              v.instr_data, scopes, v.version, v.magic, type_key=key)


def encode(m: VMExecutableModule) -> dict:
    return dict(
        magic=m.magic, version=m.version,
        functions=[dict(kind=f.kind, name=f.name, start_instr=f.start_instr, end_instr=f.end_instr,
                        num_args=f.num_args, register_file_size=f.register_file_size,
                        param_names=list(f.param_names)) for f in m.functions],
        memory_scopes=[dict(const_index=k, scope=s) for k, s in m.memory_scopes.items()],
        constants=[_constant_entry(c) for c in m.constants],
        instr_offset=m.instr_offset, instr_data=m.instr_data,
    )


# ---------------------------------------------------------------------------- instructions

def split_arg(word: int) -> tuple[int, int]:
    """An argument word as (kind, signed 56-bit value)."""
    kind = (word >> VALUE_BITS) & 0xFF
    value = word & ((1 << VALUE_BITS) - 1)
    if value >= 1 << (VALUE_BITS - 1):
        value -= 1 << VALUE_BITS
    return kind, value


def make_arg(kind: int, value: int) -> int:
    """The argument word for (kind, value) (an int64, as stored)."""
    word = (kind << VALUE_BITS) | (value & ((1 << VALUE_BITS) - 1))
    return word - (1 << 64) if word >= 1 << 63 else word


@dataclass(frozen=True)
class Instruction:
    """One decoded instruction: ``op`` and its fields (``args`` as (kind, value) pairs)."""

    op: int
    dst: int = 0
    func: int = 0
    args: tuple[tuple[int, int], ...] = ()
    offset: int = 0  # Goto pc offset, If false offset
    reg: int = 0  # Ret result, If condition


def decode_instructions(exe: VMExecutableModule) -> list[Instruction]:
    """Every instruction of the code; raises ValueError naming the first malformed one."""
    data = exe.instr_data.tolist()
    out = []
    for i, off in enumerate(exe.instr_offset.tolist()):
        where = f"instruction {i} (word {off})"
        if not 0 <= off < len(data):
            raise ValueError(f"{where}: offset outside the {len(data)} instruction words")
        op = data[off]

        def word(k: int) -> int:
            if off + k >= len(data):
                raise ValueError(f"{where}: runs past the end of the instruction words")
            return data[off + k]
        if op == OP_CALL:
            n = word(3)
            if not 0 <= n <= len(data) - off - 4:
                raise ValueError(f"{where}: call with {n} arguments runs past the end of the code")
            out.append(Instruction(op, dst=word(1), func=word(2),
                                   args=tuple(split_arg(w) for w in data[off + 4:off + 4 + n])))
        elif op == OP_RET:
            out.append(Instruction(op, reg=word(1)))
        elif op == OP_GOTO:
            out.append(Instruction(op, offset=word(1)))
        elif op == OP_IF:
            out.append(Instruction(op, reg=word(1), offset=word(2)))
        else:
            raise ValueError(f"{where}: unknown opcode {op} (expected 1 Call, 2 Ret, 3 Goto or 4 If)")
    return out


#: the loader's codec for this type key
PAYLOAD = PayloadCodec(VMExecutablePayload, decode, encode)

#: the built-in kind (installed by ``modules.py``; its runtime is ``rpcsrv.executor.vm``, attached by the
#: executor; ``rpcsrv inspect`` shows it through ``vm_text.py``)
KIND = ModuleKind(("relax.VMExecutable",), PAYLOAD, label="Relax VM function")
PLUGIN = RuntimePlugin("relax_vm", (KIND,), "Relax VM executables (TVM >= 0.21)")
