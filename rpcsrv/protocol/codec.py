"""Packed-argument sequences in both dialects, DLTensor headers and return-value conventions.

Layout (little-endian throughout, see ``rpc_reference.h``):

* classic: ``int32 num_args``, ``int32 type_code[num_args]``, then each value;
* tvm-ffi: ``int32 num_args``, then per value ``int32 type_index`` followed by the value; object
  values (string/bytes objects, remote object refs) repeat their type index as ``uint32`` first.

Values: int/float/bool as 8 bytes; handles as ``uint64``; DLDataType as ``u8 code, u8 bits, u16
lanes`` plus 4 bytes padding; DLDevice as two ``int32``; strings and bytes as ``uint64`` length then
data; DLTensor as ``u64 data, DLDevice, i32 ndim, DLDataType, i64 shape[ndim], u64 byte_offset``.

Decoding never trusts a length: every read is checked against what the packet holds, and any
violation raises :class:`ProtocolError` with the offset and what was expected.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from .codes import CLASSIC_RPC_OBJECT_REF, FFI_RPC_OBJECT_REF, Dialect, TypeCode, TypeIndex
from .dtypes import DataType, Device
from .values import FunctionHandle, Handle, ModuleHandle, ObjectHandle, OpaqueHandle, TensorHeader

MAX_NDIM = 32

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_DTYPE = struct.Struct("<BBHi")  # code, bits, lanes, padding (padding only inside packed seqs)
_DTYPE_RAW = struct.Struct("<BBH")
_DEVICE = struct.Struct("<ii")


class ProtocolError(ValueError):
    """The peer sent bytes that do not follow the protocol."""


class Reader:
    """Bounds-checked little-endian reader over a packet."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf, pos: int = 0, end: int | None = None):
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.end:
            raise ProtocolError(
                f"truncated packet: {what} needs {n} bytes at offset {self.pos}, {self.remaining} left")
        p = self.pos
        self.pos += n
        return p

    def unpack(self, st: struct.Struct, what: str):
        return st.unpack_from(self.buf, self._need(st.size, what))

    def i32(self, what: str = "int32") -> int:
        return _I32.unpack_from(self.buf, self._need(4, what))[0]

    def u32(self, what: str = "uint32") -> int:
        return _U32.unpack_from(self.buf, self._need(4, what))[0]

    def i64(self, what: str = "int64") -> int:
        return _I64.unpack_from(self.buf, self._need(8, what))[0]

    def u64(self, what: str = "uint64") -> int:
        return _U64.unpack_from(self.buf, self._need(8, what))[0]

    def f64(self, what: str = "float64") -> float:
        return _F64.unpack_from(self.buf, self._need(8, what))[0]

    def raw(self, n: int, what: str) -> memoryview:
        p = self._need(n, what)
        return self.buf[p:p + n]

    def blob(self, what: str) -> memoryview:
        n = self.u64(f"{what} length")
        if n > self.remaining:
            raise ProtocolError(f"{what} length {n} at offset {self.pos - 8} exceeds the "
                                f"{self.remaining} bytes left in the packet")
        return self.raw(n, what)

    def string(self, what: str = "string") -> str:
        data = self.blob(what)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} at offset {self.pos - len(data)} is not UTF-8: {exc}") from None

    def dtype(self, padded: bool) -> DataType:
        if padded:
            code, bits, lanes, _ = self.unpack(_DTYPE, "DLDataType")
        else:
            code, bits, lanes = self.unpack(_DTYPE_RAW, "DLDataType")
        return DataType(code, bits, lanes)

    def device(self) -> Device:
        return Device(*self.unpack(_DEVICE, "DLDevice"))

    def tensor(self) -> TensorHeader:
        data = self.u64("DLTensor data")
        dev = self.device()
        ndim = self.i32("DLTensor ndim")
        if not 0 <= ndim <= MAX_NDIM:
            raise ProtocolError(f"DLTensor ndim {ndim} at offset {self.pos - 4} is outside 0..{MAX_NDIM}")
        dt = self.dtype(padded=False)
        shape = struct.unpack_from(f"<{ndim}q", self.buf, self._need(8 * ndim, "DLTensor shape"))
        if any(d < 0 for d in shape):
            raise ProtocolError(f"DLTensor shape {shape} has a negative dimension")
        offset = self.u64("DLTensor byte_offset")
        return TensorHeader(data, dev, dt, tuple(shape), offset)


class Writer:
    """Collects a packet as a list of buffers; large byte payloads are kept by reference."""

    __slots__ = ("parts", "_cur")

    def __init__(self):
        self.parts: list = []
        self._cur = bytearray()

    def put(self, data) -> None:
        self._cur += data

    def put_big(self, data) -> None:
        if len(data) < 4096:
            self._cur += data
            return
        if self._cur:
            self.parts.append(self._cur)  # kept as is: a type index in it may still be patched
            self._cur = bytearray()
        self.parts.append(data)

    def i32(self, v: int) -> None:
        self._cur += _I32.pack(v)

    def u32(self, v: int) -> None:
        self._cur += _U32.pack(v)

    def i64(self, v: int) -> None:
        self._cur += _I64.pack(v)

    def u64(self, v: int) -> None:
        self._cur += _U64.pack(v)

    def blob(self, data) -> None:
        self.u64(len(data))
        self.put_big(data)

    def dtype(self, dt: DataType, padded: bool) -> None:
        self._cur += _DTYPE.pack(dt.code, dt.bits, dt.lanes, 0) if padded else _DTYPE_RAW.pack(
            dt.code, dt.bits, dt.lanes)

    def device(self, dev: Device) -> None:
        self._cur += _DEVICE.pack(dev.device_type, dev.device_id)

    def tensor(self, t: TensorHeader) -> None:
        self.u64(t.data)
        self.device(t.device)
        self.i32(len(t.shape))
        self.dtype(t.dtype, padded=False)
        self._cur += struct.pack(f"<{len(t.shape)}q", *t.shape)
        self.u64(t.byte_offset)

    def finish(self) -> list:
        if self._cur or not self.parts:
            self.parts.append(self._cur)
            self._cur = bytearray()
        return self.parts

    @property
    def nbytes(self) -> int:
        return sum(len(p) for p in self.parts) + len(self._cur)


# ----------------------------------------------------------------------------- decoding

def _object_ref(r: Reader) -> ObjectHandle:
    index = r.u32("object type index")
    if index != CLASSIC_RPC_OBJECT_REF:
        raise ProtocolError(f"object type index {index} is not an RPC object reference")
    return ObjectHandle(r.u64("object handle"))


def _ffi_object(r: Reader) -> Any:
    inner = r.u32("object type index")
    if inner == TypeIndex.STR:
        return r.string()
    if inner == TypeIndex.BYTES:
        return r.blob("bytes")
    if inner == FFI_RPC_OBJECT_REF:
        return ObjectHandle(r.u64("object handle"))
    raise ProtocolError(f"object type index {inner} cannot travel over RPC")


# How each kind of value is read, with its classic type code and its tvm-ffi type index (None: the
# dialect has no such code).  Dispatch goes through plain-int dicts: it runs for every argument.
_READERS = [
    (TypeCode.INT, TypeIndex.INT, Reader.i64),
    (TypeCode.UINT, None, Reader.i64),
    (TypeCode.FLOAT, TypeIndex.FLOAT, Reader.f64),
    (TypeCode.BOOL, TypeIndex.BOOL, lambda r: bool(r.i64("bool"))),
    (TypeCode.NULLPTR, TypeIndex.NONE, lambda r: None),
    (TypeCode.STR, TypeIndex.RAW_STR, Reader.string),
    (TypeCode.BYTES, TypeIndex.BYTE_ARRAY_PTR, lambda r: r.blob("bytes")),
    (TypeCode.DATA_TYPE, TypeIndex.DATA_TYPE, lambda r: r.dtype(padded=True)),
    (TypeCode.DEVICE, TypeIndex.DEVICE, Reader.device),
    (TypeCode.DLTENSOR_HANDLE, TypeIndex.DLTENSOR_PTR, Reader.tensor),
    (TypeCode.OPAQUE_HANDLE, TypeIndex.OPAQUE_PTR, lambda r: OpaqueHandle(r.u64("handle"))),
    (TypeCode.PACKED_FUNC_HANDLE, TypeIndex.FUNCTION, lambda r: FunctionHandle(r.u64("function handle"))),
    (TypeCode.MODULE_HANDLE, TypeIndex.MODULE, lambda r: ModuleHandle(r.u64("module handle"))),
    (TypeCode.OBJECT_HANDLE, None, _object_ref),
    (None, TypeIndex.SMALL_STR, _ffi_object),
    (None, TypeIndex.SMALL_BYTES, _ffi_object),
]
_CLASSIC = {int(code): read for code, _, read in _READERS if code is not None}
_FFI = {int(index): read for _, index, read in _READERS if index is not None}


def _decode_classic(r: Reader, code: int) -> Any:
    read = _CLASSIC.get(code)
    if read is None:
        raise ProtocolError(f"unknown classic type code {code} at offset {r.pos}")
    return read(r)


def _decode_ffi(r: Reader, index: int) -> Any:
    read = _FFI.get(index)
    if read is not None:
        return read(r)
    if index >= TypeIndex.STATIC_OBJECT_BEGIN:
        return _ffi_object(r)
    raise ProtocolError(f"unknown tvm-ffi type index {index} at offset {r.pos}")


def decode_packed_seq(r: Reader, dialect: Dialect) -> list:
    """Read one packed-argument sequence from ``r`` in ``dialect``."""
    n = r.i32("num_args")
    if n < 0 or n * 4 > r.remaining:
        raise ProtocolError(f"num_args {n} at offset {r.pos - 4} does not fit the packet")
    if dialect is Dialect.CLASSIC:
        codes = struct.unpack_from(f"<{n}i", r.buf, r._need(4 * n, "type codes"))
        return [_decode_classic(r, c) for c in codes]
    return [_decode_ffi(r, r.i32("type index")) for _ in range(n)]


def split_trailing_bytes(buf, offset: int, dialect: Dialect, total: int) -> tuple[list, int] | None:
    """For a packed sequence at ``offset`` whose last value is bytes running exactly to ``total`` (the
    packet's length): the values before it and the offset where those bytes start.

    ``buf`` may hold only the head of the packet (a large packet's prefix): None when the head does
    not fit in it, when the last value is not bytes, or when its length does not end the packet.  This
    is how a large upload is recognised before its body arrives, so the body can be streamed.
    """
    r = Reader(buf, offset)
    try:
        n = r.i32("num_args")
        if n < 1 or n * 4 > r.remaining:
            return None
        if dialect is Dialect.CLASSIC:
            codes = struct.unpack_from(f"<{n}i", r.buf, r._need(4 * n, "type codes"))
            if codes[-1] != TypeCode.BYTES:
                return None
            values = [_decode_classic(r, c) for c in codes[:-1]]
        else:
            values = [_decode_ffi(r, r.i32("type index")) for _ in range(n - 1)]
            index = r.i32("type index")
            if index != TypeIndex.BYTE_ARRAY_PTR:
                is_object = index >= TypeIndex.STATIC_OBJECT_BEGIN or index == TypeIndex.SMALL_BYTES
                if not is_object or r.u32("object type index") != TypeIndex.BYTES:
                    return None
        length = r.u64("bytes length")
    except ProtocolError:
        return None
    return (values, r.pos) if r.pos + length == total else None


def _plausible(values: list) -> bool:
    """Whether decoded values look like something a real client sends (used to break ties)."""
    for v in values:
        dev = v.device if isinstance(v, TensorHeader) else v if isinstance(v, Device) else None
        if dev is not None and not (1 <= dev.device_type <= 64 and 0 <= dev.device_id < 1024):
            return False
        dt = v.dtype if isinstance(v, TensorHeader) else v if isinstance(v, DataType) else None
        if dt is not None and not (dt.code <= 17 and dt.bits in (1, 4, 6, 8, 16, 32, 64, 128)
                                   and 1 <= dt.lanes <= 1024):
            return False
    return True


def detect_dialect(packet, offset: int) -> Dialect | None:
    """The dialect in which the packed sequence at ``offset`` parses, to exactly the packet's end,
    into plausible values (real devices and dtypes).

    When both dialects still fit, tvm-ffi is assumed for this packet but None is returned, so the
    caller keeps looking at later packets; when neither fits, None as well.
    """
    fits = []
    for dialect in (Dialect.CLASSIC, Dialect.FFI):
        r = Reader(packet, offset)
        try:
            values = decode_packed_seq(r, dialect)
        except ProtocolError:
            continue
        if r.remaining == 0 and _plausible(values):
            fits.append(dialect)
    return fits[0] if len(fits) == 1 else None


# ----------------------------------------------------------------------------- encoding

def _encode_one(w: Writer, v: Any, dialect: Dialect, bytes_object: bool = False) -> int:
    """Write value ``v`` (without its code) and return its type code / index.

    ``bytes_object``: in tvm-ffi, clients send bytes as a Bytes object (index repeated), servers
    return them as a byte-array pointer.
    """
    classic = dialect is Dialect.CLASSIC
    if v is None:
        return TypeCode.NULLPTR if classic else TypeIndex.NONE
    if isinstance(v, bool):
        w.i64(int(v))
        return TypeCode.BOOL if classic else TypeIndex.BOOL
    if isinstance(v, int):
        w.i64(v)
        return TypeCode.INT if classic else TypeIndex.INT
    if isinstance(v, float):
        w.put(_F64.pack(v))
        return TypeCode.FLOAT if classic else TypeIndex.FLOAT
    if isinstance(v, str):
        w.blob(v.encode("utf-8"))
        return TypeCode.STR if classic else TypeIndex.RAW_STR
    if isinstance(v, (bytes, bytearray, memoryview)):
        if classic:
            w.blob(v)
            return TypeCode.BYTES
        if bytes_object:
            w.u32(TypeIndex.BYTES)
            w.blob(v)
            return TypeIndex.BYTES
        w.blob(v)
        return TypeIndex.BYTE_ARRAY_PTR
    if isinstance(v, DataType):
        w.dtype(v, padded=True)
        return TypeCode.DATA_TYPE if classic else TypeIndex.DATA_TYPE
    if isinstance(v, Device):
        w.device(v)
        return TypeCode.DEVICE if classic else TypeIndex.DEVICE
    if isinstance(v, TensorHeader):
        w.tensor(v)
        return TypeCode.DLTENSOR_HANDLE if classic else TypeIndex.DLTENSOR_PTR
    if isinstance(v, ObjectHandle):
        w.u32(CLASSIC_RPC_OBJECT_REF if classic else FFI_RPC_OBJECT_REF)
        w.u64(v.value)
        return TypeCode.OBJECT_HANDLE if classic else FFI_RPC_OBJECT_REF
    if isinstance(v, Handle):
        w.u64(v.value)
        if isinstance(v, FunctionHandle):
            return TypeCode.PACKED_FUNC_HANDLE if classic else TypeIndex.FUNCTION
        if isinstance(v, ModuleHandle):
            return TypeCode.MODULE_HANDLE if classic else TypeIndex.MODULE
        return TypeCode.OPAQUE_HANDLE if classic else TypeIndex.OPAQUE_PTR
    raise TypeError(f"cannot send a {type(v).__name__} over RPC")


def encode_packed_seq(w: Writer, values: Sequence[Any], dialect: Dialect,
                      bytes_object: bool = False) -> None:
    """Append a packed-argument sequence of ``values`` to ``w`` (see ``_encode_one``)."""
    w.i32(len(values))
    if dialect is Dialect.FFI:
        for v in values:  # the index precedes its value: reserve it, write the value, fill it in
            buf = w._cur
            at = len(buf)
            buf += b"\0\0\0\0"
            _I32.pack_into(buf, at, _encode_one(w, v, dialect, bytes_object))
        return
    body = Writer()
    codes = [_encode_one(body, v, dialect) for v in values]
    w.put(struct.pack(f"<{len(codes)}i", *codes))
    for part in body.finish():
        w.put_big(part)
