"""Bounds-checked reading and buffer-collecting writing of one packet's fields.

Little-endian throughout.  Strings and bytes are ``uint64`` length then data; DLPack structures use
the layouts declared in :mod:`rpcsrv.protocol.structs`.  A :class:`Reader` never trusts a length:
every read is checked against what the packet holds, and a violation raises :class:`ProtocolError`
with the offset and what was expected.  A :class:`Writer` keeps large payloads by reference.
"""

from __future__ import annotations

import struct

from .dtypes import DataType, Device
from .structs import DEVICE, DTYPE, DTYPE_VALUE, TENSOR_HEAD
from .values import TensorHeader

#: most dimensions a DLTensor on the wire may have (TVM's own tensors stay far below)
MAX_NDIM = 32

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")


class ProtocolError(ValueError):
    """The peer sent bytes that do not follow the protocol."""


class Reader:
    """Bounds-checked little-endian reader over a packet."""

    __slots__ = ("buf", "pos", "end", "max_ndim")

    def __init__(self, buf, pos: int = 0, end: int | None = None, max_ndim: int = MAX_NDIM):
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
        self.pos = pos
        self.end = len(self.buf) if end is None else end
        self.max_ndim = max_ndim

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
        pos = self.pos + 8  # (no message is formatted unless the length is wrong: every string passes here)
        if pos > self.end:
            self.u64(f"{what} length")  # raises, with the offset
        (n,) = _U64.unpack_from(self.buf, self.pos)
        if n > self.end - pos:
            raise ProtocolError(f"{what} length {n} at offset {self.pos} exceeds the "
                                f"{self.end - pos} bytes left in the packet")
        self.pos = pos + n
        return self.buf[pos:pos + n]

    def string(self, what: str = "string") -> str:
        data = self.blob(what)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} at offset {self.pos - len(data)} is not UTF-8: {exc}") from None

    def dtype(self, padded: bool) -> DataType:
        return DataType(*self.unpack(DTYPE_VALUE if padded else DTYPE, "DLDataType"))

    def device(self) -> Device:
        return Device(*self.unpack(DEVICE, "DLDevice"))

    def tensor(self) -> TensorHeader:
        data, dev_type, dev_id, ndim, code, bits, lanes = self.unpack(TENSOR_HEAD, "DLTensor")
        max_ndim = self.max_ndim
        if not 0 <= ndim <= max_ndim:
            raise ProtocolError(f"DLTensor ndim {ndim} at offset {self.pos - 8} is outside 0..{max_ndim}")
        dev, dt = Device(dev_type, dev_id), DataType(code, bits, lanes)
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

    def f64(self, v: float) -> None:
        self._cur += _F64.pack(v)

    def blob(self, data) -> None:
        self.u64(len(data))
        self.put_big(data)

    def dtype(self, dt: DataType, padded: bool) -> None:
        self._cur += (DTYPE_VALUE if padded else DTYPE).pack(dt.code, dt.bits, dt.lanes)

    def device(self, dev: Device) -> None:
        self._cur += DEVICE.pack(dev.device_type, dev.device_id)

    def tensor(self, t: TensorHeader) -> None:
        d, dt = t.device, t.dtype
        self._cur += TENSOR_HEAD.pack(t.data, d.device_type, d.device_id, len(t.shape), dt.code, dt.bits, dt.lanes)
        self._cur += struct.pack(f"<{len(t.shape)}q", *t.shape)
        self.u64(t.byte_offset)

    def finish(self) -> list:
        if self._cur or not self.parts:
            self.parts.append(self._cur)
            self._cur = bytearray()
        return self.parts
