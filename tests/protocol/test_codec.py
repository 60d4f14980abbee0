"""Packed-argument codec: byte layouts written out from ``rpc_reference.h`` (v0.19.0 and HEAD), and
property tests that decoding inverts encoding in both dialects."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpcsrv.protocol import (DataType, Device, Dialect, FunctionHandle, ModuleHandle, ObjectHandle,
                             OpaqueHandle, ProtocolError, RemoteTensor, TensorHeader, decode_values,
                             encode_values, pack_return, unpack_return)
from rpcsrv.protocol.codec import detect_dialect

C, F = Dialect.CLASSIC, Dialect.FFI
i32 = lambda *v: struct.pack(f"<{len(v)}i", *v)  # noqa: E731
i64 = lambda v: struct.pack("<q", v)  # noqa: E731
u64 = lambda v: struct.pack("<Q", v)  # noqa: E731


def s(text: str) -> bytes:
    return u64(len(text)) + text.encode()


TENSOR = TensorHeader(0x1000, Device(1, 0), DataType(2, 32, 1), (2, 3), 16)
TENSOR_BYTES = u64(0x1000) + i32(1, 0) + i32(2) + bytes([2, 32, 1, 0]) + i64(2) + i64(3) + u64(16)

# (values, classic bytes, ffi bytes); layouts from SendPackedSeq in both versions of rpc_reference.h
VECTORS = [
    ([], i32(0), i32(0)),
    ([7], i32(1, 0) + i64(7), i32(1, 1) + i64(7)),
    ([-1], i32(1, 0) + i64(-1), i32(1, 1) + i64(-1)),
    ([2.5], i32(1, 2) + struct.pack("<d", 2.5), i32(1, 3) + struct.pack("<d", 2.5)),
    ([True], i32(1, 15) + i64(1), i32(1, 2) + i64(1)),
    ([None], i32(1, 4), i32(1, 0)),
    (["abc"], i32(1, 11) + s("abc"), i32(1, 8) + s("abc")),
    ([b"\x00\x01"], i32(1, 12) + u64(2) + b"\x00\x01", i32(1, 9) + u64(2) + b"\x00\x01"),
    ([DataType(2, 16, 1)], i32(1, 5) + bytes([2, 16, 1, 0]) + i32(0), i32(1, 5) + bytes([2, 16, 1, 0]) + i32(0)),
    ([Device(12, 3)], i32(1, 6) + i32(12, 3), i32(1, 6) + i32(12, 3)),
    ([OpaqueHandle(0xABC)], i32(1, 3) + u64(0xABC), i32(1, 4) + u64(0xABC)),
    ([FunctionHandle(5)], i32(1, 10) + u64(5), i32(1, 68) + u64(5)),
    ([ModuleHandle(6)], i32(1, 9) + u64(6), i32(1, 73) + u64(6)),
    ([ObjectHandle(8)], i32(1, 8) + struct.pack("<I", 9) + u64(8),
     i32(1, 115) + struct.pack("<I", 115) + u64(8)),
    ([TENSOR], i32(1, 7) + TENSOR_BYTES, i32(1, 7) + TENSOR_BYTES),
    ([1, "x"], i32(2, 0, 11) + i64(1) + s("x"), i32(2, 1) + i64(1) + i32(8) + s("x")),
]


@pytest.mark.parametrize("values,classic,ffi", VECTORS, ids=[repr(v[0])[:30] for v in VECTORS])
def test_layouts_from_tvm_source(values, classic, ffi):
    assert encode_values(values, C) == classic
    assert encode_values(values, F) == ffi
    for dialect, data in ((C, classic), (F, ffi)):
        got = decode_values(data, dialect)
        assert [bytes(v) if isinstance(v, memoryview) else v for v in got] == values


def test_ffi_object_strings_and_bytes_decode():
    # what tvm-ffi clients send for String/Bytes objects: index, repeated index, length, data
    data = i32(2, 65) + struct.pack("<I", 65) + s("hi") + i32(66) + struct.pack("<I", 66) + s("yo")
    got = decode_values(data, F)
    assert got[0] == "hi" and bytes(got[1]) == b"yo"


def test_return_conventions():
    # LocalSession::EncodeReturn: [type code, value] / tensors [code, DLTensor, handle]
    assert pack_return(None, C) == [4, None] and pack_return(None, F) == [0, None]
    assert pack_return("p", C) == [11, "p"] and pack_return("p", F) == [65, "p"]
    assert pack_return(3, F) == [1, 3] and pack_return(True, C) == [15, True]
    assert pack_return(ModuleHandle(9), C) == [9, OpaqueHandle(9)]
    assert pack_return(FunctionHandle(9), F) == [68, OpaqueHandle(9)]
    rt = RemoteTensor(TENSOR, 0x77)
    assert pack_return(rt, C) == [13, TENSOR, OpaqueHandle(0x77)]
    for d in (C, F):
        for v in (None, "p", 3, 2.0, True, ModuleHandle(9), FunctionHandle(4), rt):
            wire = decode_values(encode_values(pack_return(v, d), d), d)
            assert unpack_return(wire, d) == v


@pytest.mark.parametrize("data,dialect", [
    (i32(1, 11) + u64(100) + b"abc", C),          # string length past the end
    (i32(5), C),                                   # more args than bytes
    (i32(1, 99), C),                               # unknown type code
    (i32(1, 42), F),                               # unknown type index
    (i32(1, 7) + u64(0) + i32(1, 0) + i32(100), F),  # absurd ndim
    (i32(-1), F),                                  # negative count
    (i32(1, 11) + u64(2) + b"\xff\xfe", C),        # not UTF-8
])
def test_malformed_sequences_raise_protocol_error(data, dialect):
    with pytest.raises(ProtocolError):
        decode_values(data, dialect)


def test_dialect_detection():
    assert detect_dialect(encode_values(["tvm.rpc.server.upload"], C), 0) is C
    assert detect_dialect(encode_values(["tvm.rpc.server.upload"], F), 0) is F
    assert detect_dialect(encode_values([Device(1, 0), 0], F), 0) is F  # classic parse is implausible
    assert detect_dialect(encode_values([Device(1, 0), OpaqueHandle(0)], C), 0) is C
    assert detect_dialect(encode_values([5], F), 0) is None  # same bytes, same meaning: undecided


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1),
    st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20),
    st.builds(Device, st.integers(1, 16), st.integers(0, 7)),
    st.builds(DataType, st.integers(0, 6), st.sampled_from([8, 16, 32, 64]), st.integers(1, 4)),
    st.builds(OpaqueHandle, st.integers(0, 2 ** 64 - 1)),
    st.builds(FunctionHandle, st.integers(0, 2 ** 64 - 1)),
    st.builds(ModuleHandle, st.integers(0, 2 ** 64 - 1)),
    st.builds(TensorHeader, st.integers(0, 2 ** 64 - 1), st.builds(Device, st.integers(1, 16), st.just(0)),
              st.builds(DataType, st.just(2), st.just(32), st.just(1)),
              st.lists(st.integers(0, 1000), max_size=5).map(tuple), st.integers(0, 2 ** 32)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(scalars, max_size=6), st.sampled_from([C, F]))
def test_roundtrip_property(values, dialect):
    got = decode_values(encode_values(values, dialect), dialect)
    assert [bytes(v) if isinstance(v, memoryview) else v for v in got] == values


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80), st.sampled_from([C, F]))
def test_garbage_never_crashes(data, dialect):
    try:
        decode_values(data, dialect)
    except ProtocolError:
        pass
