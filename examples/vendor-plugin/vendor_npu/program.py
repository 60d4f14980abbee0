"""The vendor_npu program: the binary payload of one ``vendor_npu`` module, declared once (construct).

One program is one partitioned function (one packed function on the board, named ``symbol``)::

    header    "VNPU", version u16 = 1, symbol (u16 length + UTF-8), input and output counts
    tensors   u32 count, then 24-byte entries: kind (input / const / temp), dtype (float32, int8, uint8,
              int32), rank (1-4), shape (4 x u32, unused dims 0), byte offset of a const in the pool
    ops       u32 count, then 40-byte records: opcode, flags (fused relu, has bias), three input
              tensor ids (-1: none), the output tensor id, ten u16 parameters
    io        the input tensor ids, then the output tensor ids
    pool      u64 length, then the constants' bytes (each at a 64-byte aligned offset)

The op parameters: conv2d and maxpool: strides (h, w), pads (top, left, bottom, right), kernel (h, w;
maxpool only, a conv's comes from its weights), groups (conv2d).  qconv2d, the int8 convolution: strides,
pads, then the input's and the output's zero points plus 128 (6, 7; the types' ranges fit a u16 so) and
groups (8); its inputs are the int8/uint8 data, the int8 weights (zero point 0) and a per-output-channel
table, int32 (M, 2): the bias with the input's zero point folded in (``bias - x_zp * sum(w)``) and the
bits of the float32 requantize multiplier ``x_scale * w_scale / y_scale``; the output is
``saturate(round_half_even(acc * multiplier) + y_zp)``, a fused relu clamps it at ``y_zp``.  All
little-endian.  In the library the program is a u64 byte count then the program (TVM's length-prefixed
bytes), so a reader that does not know the kind can skip it.
"""

from __future__ import annotations

from construct import (Array, Const, Enum, FlagsEnum, GreedyBytes, Int8ul, Int16ul, Int32sl, Int32ul, Int64ul,
                       Padding, PascalString, Prefixed, PrefixedArray, Struct, this)

MAGIC = b"VNPU"
VERSION = 1
MAX_RANK = 4
ALIGN = 64

OPCODES = {"conv2d": 1, "add": 2, "relu": 3, "maxpool": 4, "dense": 5, "reshape": 6, "qconv2d": 7}
DTYPES = {"float32": 0, "int8": 1, "uint8": 2, "int32": 3}
#: the offset added to a zero point to store it in a u16 parameter
ZP_BIAS = 128

Tensor = Struct(
    "kind" / Enum(Int8ul, input=0, const=1, temp=2),
    "dtype" / Enum(Int8ul, **DTYPES),
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

__all__ = ["ALIGN", "DTYPES", "MAGIC", "MAX_RANK", "OPCODES", "OpRecord", "Payload", "Program", "SIZES",
           "Tensor", "VERSION", "ZP_BIAS"]
