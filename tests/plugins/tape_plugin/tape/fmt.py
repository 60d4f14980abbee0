"""The tape payload, declared once: what both halves of the plugin share.

A program is one partitioned function::

    "TAPE", version u8, symbol (u8 length + UTF-8)
    slots      u16 count, each: rank u8 then rank x u32 dims (every tensor the program touches)
    args       u8 count of slot ids (the function's inputs, in argument order)
    results    u8 count of slot ids (the function's outputs, after the inputs)
    weights    u16 count, each: slot id u16 and the const loader's name (u16 length + UTF-8)
    tape       u16 count of instructions: op u8, act u8 (on the result), srcs (u8 count of slot ids),
               dst u16, skip i16 (a slot added after act, -1: none), post u8 (act after the skip),
               ints (u8 count of i16: conv strides 2, pads 4, group; maxpool kernel 2, strides 2,
               pads 4; flatten axis; gemm transB)

In the library the program is zlib-compressed behind a u32 byte count: the count is what lets the
classic layout find the next module (zlib data alone reads to the end of the stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from construct import (Compressed, Const, Enum, Int8ul, Int16sl, Int16ul, Int32ul, PascalString, Prefixed,
                       PrefixedArray, Struct)

from rpcsrv.loader.node import ModuleNode, PayloadCodec

TYPE_KEY = "tape"
VERSION = 2
ACTS = {"none": 0, "relu": 1, "silu": 2}
OPS = {"conv": 1, "add": 2, "mul": 3, "sigmoid": 4, "relu": 5, "maxpool": 6, "flatten": 7, "gemm": 8}

Slot = Struct("dims" / PrefixedArray(Int8ul, Int32ul))
Weight = Struct("slot" / Int16ul, "name" / PascalString(Int16ul, "utf8"))
Instr = Struct(
    "op" / Enum(Int8ul, **OPS),
    "act" / Enum(Int8ul, **ACTS),
    "srcs" / PrefixedArray(Int8ul, Int16ul),
    "dst" / Int16ul,
    "skip" / Int16sl,
    "post" / Enum(Int8ul, **ACTS),
    "ints" / PrefixedArray(Int8ul, Int16sl),
)
Program = Struct(
    "magic" / Const(b"TAPE"),
    "version" / Const(VERSION, Int8ul),
    "symbol" / PascalString(Int8ul, "utf8"),
    "slots" / PrefixedArray(Int16ul, Slot),
    "args" / PrefixedArray(Int8ul, Int16ul),
    "results" / PrefixedArray(Int8ul, Int16ul),
    "weights" / PrefixedArray(Int16ul, Weight),
    "tape" / PrefixedArray(Int16ul, Instr),
)
#: the payload: u32 byte count, then the zlib-compressed program
PAYLOAD = Prefixed(Int32ul, Compressed(Program, "zlib"))


@dataclass(eq=False, repr=False)
class TapeModule(ModuleNode):
    """A decoded tape program (the construct value of :data:`Program`)."""

    program: Any = None
    type_key: str = field(default=TYPE_KEY, kw_only=True)


def decode(value, type_key: str) -> TapeModule:
    """Check what can be checked without running: slot ids, known opcodes and activations."""
    count = len(value.slots)

    def slot(i: int, what: str) -> None:
        if not 0 <= i < count:
            raise ValueError(f"tape {value.symbol}: {what} names slot {i}, the program has {count}")

    for i in list(value.args) + list(value.results):
        slot(i, "an argument")
    for w in value.weights:
        slot(w.slot, f"weight {w.name!r}")
    for k, ins in enumerate(value.tape):
        for name in ("op", "act", "post"):
            if not isinstance(ins[name], str):
                raise ValueError(f"tape {value.symbol}: instruction {k} has unknown {name} {int(ins[name])}")
        for i in list(ins.srcs) + [ins.dst] + ([ins.skip] if ins.skip >= 0 else []):
            slot(i, f"instruction {k} ({ins.op})")
    return TapeModule(value, type_key=type_key)


def encode(node: TapeModule):
    return node.program


CODEC = PayloadCodec(PAYLOAD, decode, encode)
