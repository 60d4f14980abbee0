"""How a function's return value travels back (``LocalSession::EncodeReturn``).

A kCallFunc answer is a packed sequence whose first value is the *type code* (classic) or *type index*
(tvm-ffi) of the result, followed by the result itself:

* scalars, strings, bytes, devices, dtypes: ``[code, value]``;
* functions, modules, objects: ``[code, opaque handle]`` — the client wraps the handle;
* tensors (NDArray): ``[code, DLTensor header, opaque handle]`` — the header gives the client the data
  pointer, shape and dtype; the handle is what the client frees (kFreeHandle) when done.

Syscall answers carry just the value (``[value]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codec import ProtocolError
from .codes import Dialect, TypeCode, TypeIndex
from .dtypes import DataType, Device
from .values import FunctionHandle, Handle, ModuleHandle, ObjectHandle, OpaqueHandle, TensorHeader


@dataclass(frozen=True)
class RemoteTensor:
    """An NDArray owned by the server: its DLTensor header and the handle that frees it."""

    header: TensorHeader
    handle: int


# (python kind, classic code, ffi index)
_KINDS = [
    (RemoteTensor, TypeCode.NDARRAY_HANDLE, TypeIndex.TENSOR),
    (FunctionHandle, TypeCode.PACKED_FUNC_HANDLE, TypeIndex.FUNCTION),
    (ModuleHandle, TypeCode.MODULE_HANDLE, TypeIndex.MODULE),
    (ObjectHandle, TypeCode.OBJECT_HANDLE, TypeIndex.OBJECT),
    (type(None), TypeCode.NULLPTR, TypeIndex.NONE),
    (bool, TypeCode.BOOL, TypeIndex.BOOL),
    (int, TypeCode.INT, TypeIndex.INT),
    (float, TypeCode.FLOAT, TypeIndex.FLOAT),
    (str, TypeCode.STR, TypeIndex.STR),
    (bytes, TypeCode.BYTES, TypeIndex.BYTES),
    (bytearray, TypeCode.BYTES, TypeIndex.BYTES),
    (memoryview, TypeCode.BYTES, TypeIndex.BYTES),
    (DataType, TypeCode.DATA_TYPE, TypeIndex.DATA_TYPE),
    (Device, TypeCode.DEVICE, TypeIndex.DEVICE),
    (OpaqueHandle, TypeCode.OPAQUE_HANDLE, TypeIndex.OPAQUE_PTR),
]


_BY_TYPE = {kind: (int(classic), int(ffi)) for kind, classic, ffi in _KINDS}


def pack_return(value: Any, dialect: Dialect) -> list:
    """The packed sequence a server sends for return value ``value``."""
    codes = _BY_TYPE.get(type(value))  # exact types first (every small call passes here)
    if codes is None:
        for kind, classic, ffi in _KINDS:
            if kind is not bool and kind is not int and isinstance(value, kind):
                codes = (int(classic), int(ffi))
                break
        else:
            raise TypeError(f"cannot return a {type(value).__name__} over RPC")
    code = codes[0] if dialect is Dialect.CLASSIC else codes[1]
    if isinstance(value, RemoteTensor):
        return [code, value.header, OpaqueHandle(value.handle)]
    if isinstance(value, Handle) and not isinstance(value, OpaqueHandle):
        return [code, OpaqueHandle(value.value)]
    return [code, value]


def unpack_return(values: list, dialect: Dialect) -> Any:
    """The client side of :func:`pack_return`: rebuild the returned value."""
    if not values:
        return None
    if len(values) == 1:  # ReturnVoid / syscall answers
        return values[0]
    code = values[0]
    classic = dialect is Dialect.CLASSIC
    if code == (TypeCode.NDARRAY_HANDLE if classic else TypeIndex.TENSOR):
        if len(values) != 3 or not isinstance(values[1], TensorHeader):
            raise ProtocolError("tensor return must be [code, DLTensor, handle]")
        return RemoteTensor(values[1], values[2].value)
    if code == (TypeCode.PACKED_FUNC_HANDLE if classic else TypeIndex.FUNCTION):
        return FunctionHandle(values[1].value)
    if code == (TypeCode.MODULE_HANDLE if classic else TypeIndex.MODULE):
        return ModuleHandle(values[1].value)
    if isinstance(values[1], OpaqueHandle) and code in (
            (TypeCode.OBJECT_HANDLE,) if classic else tuple(range(64, 1 << 16))):
        return ObjectHandle(values[1].value)
    if isinstance(values[1], memoryview):
        return bytes(values[1])
    return values[1]
