"""Packed-argument sequences in both dialects (``rpc_reference.h``).

* classic: ``int32 num_args``, ``int32 type_code[num_args]``, then each value;
* tvm-ffi: ``int32 num_args``, then per value ``int32 type_index`` followed by the value; object
  values (string/bytes objects, remote object refs) repeat their type index as ``uint32`` first.

What each code means and how its value is read and written is the kinds table
(:mod:`rpcsrv.protocol.kinds`); this module only walks sequences, detects the peer's dialect from the
first sequence that tells them apart, and recognises a large upload from the head of its packet.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from .codes import Dialect, TypeCode, TypeIndex
from .dtypes import DataType, Device
from .kinds import CLIENT_TABLES, TABLES
from .values import TensorHeader
from .wire import MAX_NDIM, ProtocolError, Reader, Writer

__all__ = ["MAX_NDIM", "ProtocolError", "Reader", "Writer", "decode_packed_seq", "encode_packed_seq",
           "detect_dialect", "split_trailing_bytes"]

_I32 = struct.Struct("<i")


def _codes(r: Reader, n: int) -> tuple:
    return struct.unpack_from(f"<{n}i", r.buf, r._need(4 * n, "type codes"))


def decode_packed_seq(r: Reader, dialect: Dialect) -> list:
    """Read one packed-argument sequence from ``r`` in ``dialect``."""
    return TABLES[dialect].decode_seq(r)


def split_trailing_bytes(buf, offset: int, dialect: Dialect, total: int) -> tuple[list, int] | None:
    """For a packed sequence at ``offset`` whose last value is bytes running exactly to ``total`` (the
    packet's length): the values before it and the offset where those bytes start.

    ``buf`` may hold only the head of the packet (a large packet's prefix): None when the head does
    not fit in it, when the last value is not bytes, or when its length does not end the packet.  This
    is how a large upload is recognised before its body arrives, so the body can be streamed.
    """
    r = Reader(buf, offset)
    table = TABLES[dialect]
    try:
        n = r.i32("num_args")
        if n < 1 or n * 4 > r.remaining:
            return None
        if dialect is Dialect.CLASSIC:
            codes = _codes(r, n)
            if codes[-1] != TypeCode.BYTES:
                return None
            values = [table.read(r, c) for c in codes[:-1]]
        else:
            values = [table.read(r, r.i32("type index")) for _ in range(n - 1)]
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

    When both dialects still fit, None is returned (the caller reads this packet in the default
    dialect and keeps looking at later packets); when neither fits, None as well.
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


def encode_packed_seq(w: Writer, values: Sequence[Any], dialect: Dialect,
                      bytes_object: bool = False) -> None:
    """Append a packed-argument sequence of ``values`` to ``w``.

    ``bytes_object``: in tvm-ffi, clients send bytes as a Bytes object (index repeated), servers
    return them as a byte-array pointer."""
    table = (CLIENT_TABLES if bytes_object else TABLES)[dialect]
    w.i32(len(values))
    if dialect is Dialect.FFI:
        for v in values:  # the index precedes its value: reserve it, write the value, fill it in
            buf = w._cur
            at = len(buf)
            buf += b"\0\0\0\0"
            _I32.pack_into(buf, at, table.write(w, v))
        return
    body = Writer()
    codes = [table.write(body, v) for v in values]
    w.put(struct.pack(f"<{len(codes)}i", *codes))
    for part in body.finish():
        w.put_big(part)
