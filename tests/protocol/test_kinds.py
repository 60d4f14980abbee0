"""The one table of value kinds and the DLPack structures declared once.

* the construct declarations and the ``struct.Struct`` forms derived from them agree byte for byte
  (the codec uses the derived forms, the loader the declarations);
* every kind the table lists for a dialect decodes what it encodes, and its argument/return codes are
  TVM's numbers (``rpc_reference.h``, ``EncodeReturn``);
* the loader's NDArray header is built from the same DLDataType/DLDevice declarations.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rpcsrv.loader import formats
from rpcsrv.protocol import (KINDS, DataType, Device, Dialect, FunctionHandle, ModuleHandle, ObjectHandle,
                             OpaqueHandle, RemoteTensor, TensorHeader, decode_values, encode_values,
                             pack_return, unpack_return)
from rpcsrv.protocol import structs
from rpcsrv.protocol.kinds import TABLES, wire_dialect
from rpcsrv.protocol.wire import Reader, Writer

dims = st.lists(st.integers(0, 2**40), max_size=6)
headers = st.builds(TensorHeader, st.integers(0, 2**64 - 1),
                    st.builds(Device, st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1)),
                    st.builds(DataType, st.integers(0, 255), st.integers(0, 255), st.integers(0, 65535)),
                    dims.map(tuple), st.integers(0, 2**64 - 1))


def _as_construct(t: TensorHeader) -> dict:
    return dict(data=t.data, device=dict(device_type=t.device.device_type, device_id=t.device.device_id),
                ndim=len(t.shape), dtype=dict(code=t.dtype.code, bits=t.dtype.bits, lanes=t.dtype.lanes),
                shape=list(t.shape), byte_offset=t.byte_offset)


@settings(max_examples=200, deadline=None)
@given(headers)
def test_dltensor_declaration_and_fast_codec_agree(t):
    built = structs.DLTensor.build(_as_construct(t))
    w = Writer()
    w.tensor(t)
    assert b"".join(bytes(p) for p in w.finish()) == built
    assert Reader(built).tensor() == t
    parsed = structs.DLTensor.parse(built)
    assert (parsed.data, tuple(parsed.shape), parsed.byte_offset) == (t.data, t.shape, t.byte_offset)


def test_derived_structs_follow_the_declarations():
    assert structs.DTYPE.size == structs.DLDataType.sizeof() == 4
    assert structs.DTYPE_VALUE.size == structs.DLDataTypeValue.sizeof() == 8  # one TVMValue slot
    assert structs.DEVICE.size == structs.DLDevice.sizeof() == 8
    assert structs.TENSOR_HEAD.size == structs.DLTensorHead.sizeof() == 24
    assert structs.DTYPE_VALUE.pack(2, 32, 1) == structs.DLDataTypeValue.build(
        dict(dtype=dict(code=2, bits=32, lanes=1)))


def test_loader_ndarray_header_uses_the_protocol_declarations():
    assert formats.DLDataTypeFormat is structs.DLDataType
    assert formats.DLDeviceFormat is structs.DLDevice


SAMPLES = {
    "none": None, "bool": True, "int": -5, "float": 0.25, "str": "héllo", "bytes": b"\x00\xff",
    "dtype": DataType(2, 16, 4), "device": Device(12, 1),
    "tensor": TensorHeader(7, Device(1, 0), DataType(0, 8, 1), (3,), 0),
    "opaque": OpaqueHandle(9), "function": FunctionHandle(10), "module": ModuleHandle(11),
    "object": ObjectHandle(12),
}


def test_every_argument_kind_round_trips_in_both_dialects():
    sendable = {k.name for k in KINDS if k.types and (k.classic is not None or k.ffi is not None)}
    assert sendable == set(SAMPLES)
    for dialect in Dialect:
        for name, v in SAMPLES.items():
            got = decode_values(encode_values([v], dialect), dialect)
            assert (bytes(got[0]) if isinstance(got[0], memoryview) else got[0]) == v, (dialect, name)


# EncodeReturn's codes (classic TypeCode, tvm-ffi TypeIndex) for each returned kind
RETURN_CODES = [
    (None, 4, 0), (True, 15, 2), (3, 0, 1), (1.5, 2, 3), ("s", 11, 65), (b"b", 12, 66),
    (DataType(2, 32, 1), 5, 5), (Device(1, 0), 6, 6), (OpaqueHandle(1), 3, 4),
    (FunctionHandle(2), 10, 68), (ModuleHandle(3), 9, 73), (ObjectHandle(4), 8, 64),
    (RemoteTensor(TensorHeader(5, Device(1, 0), DataType(2, 32, 1), (1,), 0), 6), 13, 70),
]


def test_return_codes_and_round_trip():
    for value, classic, ffi in RETURN_CODES:
        for dialect, code in ((Dialect.CLASSIC, classic), (Dialect.FFI, ffi)):
            packed = pack_return(value, dialect)
            assert packed[0] == code, (value, dialect)
            wire = decode_values(encode_values(packed, dialect), dialect)
            assert unpack_return(wire, dialect) == value


def test_subclasses_use_their_base_kind():
    import enum

    class Color(enum.IntEnum):
        RED = 3

    assert pack_return(Color.RED, Dialect.FFI)[0] == 1
    assert decode_values(encode_values([Color.RED], Dialect.CLASSIC), Dialect.CLASSIC) == [3]


def test_the_default_dialect_lives_in_one_place():
    assert wire_dialect(None) is Dialect.FFI and wire_dialect(Dialect.CLASSIC) is Dialect.CLASSIC
    assert set(TABLES) == set(Dialect)
