"""The vendor_npu program: the binary payload of one ``vendor_npu`` module, declared once (construct).

One program is one partitioned function (one packed function on the board, named ``symbol``)::

    header    "VNPU", version u16 = 1, symbol (u16 length + UTF-8), input and output counts
    tensors   u32 count, then 24-byte entries: kind (input / const / temp), dtype (float32),
              rank (1-4), shape (4 x u32, unused dims 0), byte offset of a const in the pool
    ops       u32 count, then 40-byte records: opcode, flags (fused relu, has bias), three input
              tensor ids (-1: none), the output tensor id, ten u16 parameters
    io        the input tensor ids, then the output tensor ids
    pool      u64 length, then the constants' bytes (each at a 64-byte aligned offset)

The op parameters: conv2d and maxpool: strides (h, w), pads (top, left, bottom, right), kernel (h, w;
maxpool only, a conv's comes from its weights), groups (conv2d).  All little-endian.  In the library
the program is a u64 byte count then the program (TVM's length-prefixed bytes), so a reader that
does not know the kind can skip it.
"""

from __future__ import annotations

from construct import (Array, Const, Enum, FlagsEnum, GreedyBytes, Int8ul, Int16ul, Int32sl, Int32ul, Int64ul,
                       Padding, PascalString, Prefixed, PrefixedArray, Struct, this)

MAGIC = b"VNPU"
VERSION = 1
MAX_RANK = 4
ALIGN = 64

OPCODES = {"conv2d": 1, "add": 2, "relu": 3, "maxpool": 4, "dense": 5, "reshape": 6}

Tensor = Struct(
    "kind" / Enum(Int8ul, input=0, const=1, temp=2),
    "dtype" / Enum(Int8ul, float32=0),
    "rank" / Int8ul,
    Padding(1),
    "shape" / Array(MAX_RANK, Int32ul),
    "offset" / Int32ul,
)

OpRecord = Struct(
    "opcode" / Enum(Int8ul, **OPCODES),
    "flags" / FlagsEnum(Int8ul, relu=1, bias=2),
    Padding(2),
    "inputs" / Array(3, Int32sl),
    "output" / Int32ul,
    "params" / Array(10, Int16ul),
)

Program = Struct(
    "magic" / Const(MAGIC),
    "version" / Const(VERSION, Int16ul),
    "symbol" / PascalString(Int16ul, "utf8"),
    "num_inputs" / Int16ul,
    "num_outputs" / Int16ul,
    "tensors" / PrefixedArray(Int32ul, Tensor),
    "ops" / PrefixedArray(Int32ul, OpRecord),
    "inputs" / Array(this.num_inputs, Int32ul),
    "outputs" / Array(this.num_outputs, Int32ul),
    "pool" / Prefixed(Int64ul, GreedyBytes),
)

#: the module payload in a library: u64 length, then the program
Payload = Prefixed(Int64ul, Program)

#: the fixed record sizes the format promises (checked by the tests)
SIZES = {"tensor": Tensor.sizeof(), "op": OpRecord.sizeof()}

__all__ = ["ALIGN", "MAGIC", "MAX_RANK", "OPCODES", "OpRecord", "Payload", "Program", "SIZES",
           "Tensor", "VERSION"]
