"""Python values for what travels in a packed-argument sequence.

Plain Python types cover the scalars: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``
(decoded byte arrays arrive as ``memoryview`` slices of the packet, to avoid copying uploads), plus
``Device`` and ``DataType`` from :mod:`rpcsrv.protocol.dtypes`.  Handles (remote pointers) and DLTensor
headers get the small types below, so the codec can pick the right code in either dialect.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DataType, Device


@dataclass(frozen=True)
class Handle:
    """A 64-bit handle naming something on the peer; the subclass says what kind."""

    value: int

    def __repr__(self) -> str:
        return f"{type(self).__name__}(0x{self.value:x})"


class OpaqueHandle(Handle):
    """``void*``: data pointers, streams, and how servers return function/module handles."""


class FunctionHandle(Handle):
    """A packed function living on the server (client → server only)."""


class ModuleHandle(Handle):
    """A module living on the server (client → server only)."""


class ObjectHandle(Handle):
    """A remote object reference (``RPCObjectRef``)."""


@dataclass(frozen=True)
class TensorHeader:
    """A DLTensor as the wire carries it: data handle, device, dtype, shape, byte offset.

    Strides are never sent (TVM refuses strided tensors on the wire).
    """

    data: int
    device: Device
    dtype: DataType
    shape: tuple[int, ...]
    byte_offset: int = 0

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


@dataclass(frozen=True)
class RemoteTensor:
    """An NDArray owned by the server: its DLTensor header and the handle that frees it."""

    header: TensorHeader
    handle: int
