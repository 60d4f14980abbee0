"""The kinds of value that travel over RPC: one table for both dialects, for arguments and returns.

Each :class:`Kind` says which Python types encode as it, its classic type code and tvm-ffi type index
(``rpc_reference.h`` at v0.19.0 and at HEAD), how its value is read and written, and which code it
carries when it is a function's return value (``LocalSession::EncodeReturn``), where that differs.
:class:`DialectTable` turns the table into the plain-int dictionaries the codec dispatches through
(decode by code, encode by Python type, pack and unpack returns), one per dialect.

Returns: a kCallFunc answer is ``[code, value...]``: scalars, strings, bytes, devices and dtypes as
``[code, value]``; functions, modules and objects as ``[code, opaque handle]``; an NDArray as ``[code,
DLTensor, opaque handle]`` (the handle is what the client frees).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .codes import CLASSIC_RPC_OBJECT_REF, FFI_RPC_OBJECT_REF, Dialect, RPCCode, TypeCode, TypeIndex
from .dtypes import DataType, Device
from .values import FunctionHandle, ModuleHandle, ObjectHandle, OpaqueHandle, RemoteTensor, TensorHeader
from .wire import ProtocolError, Reader, Writer

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")

#: the dialect assumed for what is sent or read before the peer's dialect is known
DEFAULT_DIALECT = Dialect.FFI


def wire_dialect(dialect: Optional[Dialect]) -> Dialect:
    """``dialect``, or the default while it is unknown (the one place that fallback lives)."""
    return dialect or DEFAULT_DIALECT


# ----------------------------------------------------------------------------- readers and writers

def _read_object_ref(r: Reader) -> ObjectHandle:
    index = r.u32("object type index")
    if index != CLASSIC_RPC_OBJECT_REF:
        raise ProtocolError(f"object type index {index} is not an RPC object reference")
    return ObjectHandle(r.u64("object handle"))


def read_ffi_object(r: Reader) -> Any:
    """A tvm-ffi object value: its type index repeated as ``u32``, then a string, bytes or reference."""
    inner = r.u32("object type index")
    if inner == TypeIndex.STR:
        return r.string()
    if inner == TypeIndex.BYTES:
        return r.blob("bytes")
    if inner == FFI_RPC_OBJECT_REF:
        return ObjectHandle(r.u64("object handle"))
    raise ProtocolError(f"object type index {inner} cannot travel over RPC")


def _write_object_ref(w: Writer, v: ObjectHandle, classic: bool) -> None:
    w.u32(CLASSIC_RPC_OBJECT_REF if classic else FFI_RPC_OBJECT_REF)
    w.u64(v.value)


def _write_bytes_object(w: Writer, v, classic: bool) -> None:
    w.u32(TypeIndex.BYTES)
    w.blob(v)


def _handle_return(v) -> list:
    return [OpaqueHandle(v.value)]


@dataclass(frozen=True)
class Kind:
    """One kind of value.  ``classic``/``ffi``: its code as an argument (None: the dialect has none);
    ``ret_classic``/``ret_ffi``: its code as a return value when that differs; ``as_return``: the wire
    values after the code in a return (default ``[value]``); ``from_return``: the client's inverse;
    ``ffi_read``: the tvm-ffi reader when it differs from ``read``; ``pack``: for plain values, their
    bytes as one function of the value (``write`` then puts them; a returned one is sent from a
    packet head made once per dialect, :meth:`DialectTable.return_packet`)."""

    name: str
    types: tuple
    classic: Optional[int]
    ffi: Optional[int]
    read: Optional[Callable[[Reader], Any]]
    write: Optional[Callable[[Writer, Any, bool], None]]
    ret_classic: Optional[int] = None
    ret_ffi: Optional[int] = None
    as_return: Optional[Callable[[Any], list]] = None
    from_return: Optional[Callable[[list], Any]] = None
    ffi_read: Optional[Callable[[Reader], Any]] = None  # when tvm-ffi reads it differently
    pack: Optional[Callable[[Any], bytes]] = None  # its bytes, when they depend on the value alone

    def code(self, dialect: Dialect, returned: bool = False) -> Optional[int]:
        classic = dialect is Dialect.CLASSIC
        if returned:
            ret = self.ret_classic if classic else self.ret_ffi
            if ret is not None:
                return ret
        return self.classic if classic else self.ffi


def _tensor_from_return(values: list) -> RemoteTensor:
    if len(values) != 3 or not isinstance(values[1], TensorHeader) or not isinstance(values[2], OpaqueHandle):
        raise ProtocolError("tensor return must be [code, DLTensor, handle]")
    return RemoteTensor(values[1], values[2].value)


def _handle_from_return(kind: type) -> Callable[[list], Any]:
    def rebuild(values: list):
        if not isinstance(values[1], OpaqueHandle):
            raise ProtocolError(f"{kind.__name__} return must carry a handle, got {type(values[1]).__name__}")
        return kind(values[1].value)
    return rebuild


_BYTES = (bytes, bytearray, memoryview)

def _str_bytes(v: str) -> bytes:
    data = v.encode("utf-8")
    return _U64.pack(len(data)) + data


def _plain(name: str, types: tuple, classic: int, ffi: int, read, pack, **extra) -> Kind:
    """A kind whose bytes are ``pack(value)``: its writer puts them."""
    return Kind(name, types, classic, ffi, read, lambda w, v, c: w.put(pack(v)), pack=pack, **extra)


KINDS = [
    _plain("none", (type(None),), TypeCode.NULLPTR, TypeIndex.NONE, lambda r: None, lambda v: b""),
    _plain("bool", (bool,), TypeCode.BOOL, TypeIndex.BOOL, lambda r: bool(r.i64("bool")),
           lambda v: _I64.pack(int(v))),
    _plain("int", (int,), TypeCode.INT, TypeIndex.INT, Reader.i64, _I64.pack),
    Kind("uint", (), TypeCode.UINT, None, Reader.i64, None),
    _plain("float", (float,), TypeCode.FLOAT, TypeIndex.FLOAT, Reader.f64, _F64.pack),
    _plain("str", (str,), TypeCode.STR, TypeIndex.RAW_STR, Reader.string, _str_bytes, ret_ffi=TypeIndex.STR),
    Kind("bytes", _BYTES, TypeCode.BYTES, TypeIndex.BYTE_ARRAY_PTR, lambda r: r.blob("bytes"),
         lambda w, v, c: w.blob(v), ret_ffi=TypeIndex.BYTES, from_return=lambda vs: bytes(vs[1])),
    # tvm-ffi clients send bytes as a Bytes object (see DialectTable's bytes_object)
    Kind("bytes object", (), None, TypeIndex.BYTES, None, _write_bytes_object),
    Kind("dtype", (DataType,), TypeCode.DATA_TYPE, TypeIndex.DATA_TYPE, lambda r: r.dtype(padded=True),
         lambda w, v, c: w.dtype(v, padded=True)),
    Kind("device", (Device,), TypeCode.DEVICE, TypeIndex.DEVICE, Reader.device, lambda w, v, c: w.device(v)),
    Kind("tensor", (TensorHeader,), TypeCode.DLTENSOR_HANDLE, TypeIndex.DLTENSOR_PTR, Reader.tensor,
         lambda w, v, c: w.tensor(v)),
    Kind("opaque", (OpaqueHandle,), TypeCode.OPAQUE_HANDLE, TypeIndex.OPAQUE_PTR,
         lambda r: OpaqueHandle(r.u64("handle")), lambda w, v, c: w.u64(v.value)),
    Kind("function", (FunctionHandle,), TypeCode.PACKED_FUNC_HANDLE, TypeIndex.FUNCTION,
         lambda r: FunctionHandle(r.u64("function handle")), lambda w, v, c: w.u64(v.value),
         as_return=_handle_return, from_return=_handle_from_return(FunctionHandle)),
    Kind("module", (ModuleHandle,), TypeCode.MODULE_HANDLE, TypeIndex.MODULE,
         lambda r: ModuleHandle(r.u64("module handle")), lambda w, v, c: w.u64(v.value),
         as_return=_handle_return, from_return=_handle_from_return(ModuleHandle)),
    Kind("object", (ObjectHandle,), TypeCode.OBJECT_HANDLE, FFI_RPC_OBJECT_REF, _read_object_ref,
         _write_object_ref, ret_ffi=TypeIndex.OBJECT, as_return=_handle_return,
         from_return=_handle_from_return(ObjectHandle), ffi_read=read_ffi_object),
    # NDArrays only travel as return values (arguments are DLTensor headers)
    Kind("ndarray", (RemoteTensor,), None, None, None, None, ret_classic=TypeCode.NDARRAY_HANDLE,
         ret_ffi=TypeIndex.TENSOR, as_return=lambda v: [v.header, OpaqueHandle(v.handle)],
         from_return=_tensor_from_return),
    # tvm-ffi string/bytes objects: a small inline form and the object form, read alike
    Kind("ffi small str", (), None, TypeIndex.SMALL_STR, read_ffi_object, None),
    Kind("ffi small bytes", (), None, TypeIndex.SMALL_BYTES, read_ffi_object, None),
]


class DialectTable:
    """The kinds table seen from one dialect, as plain dictionaries (dispatch runs per argument).

    ``bytes_object``: encode bytes as a tvm-ffi Bytes object (what tvm-ffi clients send; servers
    return byte arrays)."""

    def __init__(self, dialect: Dialect, bytes_object: bool = False):
        classic = dialect is Dialect.CLASSIC
        self.dialect, self.classic = dialect, classic
        self.readers: dict[int, Callable] = {}
        self.writers: dict[type, tuple[int, Callable]] = {}
        self.return_codes: dict[type, int] = {}
        self.return_kinds: dict[int, Kind] = {}
        for kind in KINDS:
            code, ret = kind.code(dialect), kind.code(dialect, returned=True)
            read = kind.read if classic or kind.ffi_read is None else kind.ffi_read
            if code is not None and read is not None:
                self.readers.setdefault(int(code), read)
            if kind.name == "bytes object":
                if bytes_object and not classic:
                    for t in _BYTES:
                        self.writers[t] = (int(code), kind.write)
                continue
            for t in kind.types:
                if code is not None and kind.write is not None:
                    self.writers.setdefault(t, (int(code), kind.write))
                if ret is not None:
                    self.return_codes[t] = int(ret)
            if ret is not None and kind.types:
                self.return_kinds.setdefault(int(ret), kind)
        # a plain value's return packet is a head fixed per type (the RPC code, the sequence's count
        # and codes, the return code) and the value's bytes: the head is made here, once
        self.return_heads: dict[type, tuple[bytes, Callable[[Any], bytes]]] = {}
        int_code = self.writers[int][0]
        for kind in KINDS:
            for t in kind.types if kind.pack is not None and kind.as_return is None else ():
                ret, code = self.return_codes[t], self.writers[t][0]
                seq = struct.pack("<iiiq", 2, int_code, code, ret) if classic else \
                    struct.pack("<iiqi", 2, int_code, ret, code)
                self.return_heads[t] = (_I32.pack(RPCCode.RETURN) + seq, kind.pack)

    def _lookup(self, table: dict, value: Any, what: str):
        found = table.get(type(value))  # exact types first: every argument passes here
        if found is None:
            for base in type(value).__mro__[1:]:  # subclasses (IntEnum, numpy bools are not ints)
                found = table.get(base)
                if found is not None:
                    table[type(value)] = found
                    break
            else:
                raise TypeError(f"cannot {what} a {type(value).__name__} over RPC")
        return found

    def decode_seq(self, r: Reader) -> list:
        """Read one packed-argument sequence (classic: its codes first, then the values; tvm-ffi:
        each value after its index).  Bound once per dialect: the parser's per-packet entry."""
        n = r.i32("num_args")
        if n < 0 or n * 4 > r.end - r.pos:
            raise ProtocolError(f"num_args {n} at offset {r.pos - 4} does not fit the packet")
        readers, unknown = self.readers, self._unknown
        if self.classic:
            codes = struct.unpack_from(f"<{n}i", r.buf, r._need(4 * n, "type codes"))
            return [(readers.get(c) or unknown(c))(r) for c in codes]
        out = []
        unpack, buf = _I32.unpack_from, r.buf
        for _ in range(n):
            pos = r.pos
            if pos + 4 > r.end:
                r.i32("type index")  # raises, with the offset
            r.pos = pos + 4
            (code,) = unpack(buf, pos)
            out.append((readers.get(code) or unknown(code))(r))
        return out

    def _unknown(self, code: int) -> Callable[[Reader], Any]:
        """The reader of a code the table has no entry for: any tvm-ffi object, or an error."""
        if not self.classic and code >= TypeIndex.STATIC_OBJECT_BEGIN:
            return read_ffi_object

        def refuse(r: Reader):
            raise ProtocolError(f"unknown {'classic type code' if self.classic else 'tvm-ffi type index'} "
                                f"{code} at offset {r.pos}")
        return refuse

    def read(self, r: Reader, code: int) -> Any:
        read = self.readers.get(code)
        if read is not None:
            return read(r)
        if not self.classic and code >= TypeIndex.STATIC_OBJECT_BEGIN:
            return read_ffi_object(r)
        raise ProtocolError(f"unknown {'classic type code' if self.classic else 'tvm-ffi type index'} "
                            f"{code} at offset {r.pos}")

    def write(self, w: Writer, value: Any) -> int:
        """Write ``value`` (without its code) and return its code."""
        code, write = self._lookup(self.writers, value, "send")
        write(w, value, self.classic)
        return code

    def pack_return(self, value: Any) -> list:
        """The packed sequence a server sends for return value ``value``."""
        code = self._lookup(self.return_codes, value, "return")
        kind = self.return_kinds[code]
        return [code, *kind.as_return(value)] if kind.as_return else [code, value]

    def return_packet(self, value: Any) -> Optional[bytes]:
        """The whole kRETURN packet (length included) for a plain ``value`` (None, bool, int, float,
        str): the same bytes as encoding :meth:`pack_return`'s sequence, from a head made once.
        None for any other value."""
        found = self.return_heads.get(type(value))
        if found is None:
            return None
        head, pack = found
        payload = pack(value)
        return _I64.pack(len(head) + len(payload)) + head + payload

    def unpack_return(self, values: list) -> Any:
        """The client side of :meth:`pack_return`."""
        if not values:
            return None
        if len(values) == 1:  # ReturnVoid / syscall answers
            return values[0]
        code = values[0]
        kind = self.return_kinds.get(code)
        if kind is not None and kind.from_return is not None:
            if kind.name == "bytes" and not isinstance(values[1], _BYTES):
                return values[1]
            return kind.from_return(values)
        if not self.classic and isinstance(code, int) and code >= TypeIndex.STATIC_OBJECT_BEGIN \
                and isinstance(values[1], OpaqueHandle):
            return ObjectHandle(values[1].value)  # any other tvm-ffi object comes back as a reference
        if isinstance(values[1], memoryview):
            return bytes(values[1])
        return values[1]


TABLES = {Dialect.CLASSIC: DialectTable(Dialect.CLASSIC), Dialect.FFI: DialectTable(Dialect.FFI)}
CLIENT_TABLES = {Dialect.CLASSIC: TABLES[Dialect.CLASSIC], Dialect.FFI: DialectTable(Dialect.FFI, True)}
