"""Data types and devices as DLPack and TVM put them on the wire and in files.

One table maps DLPack ``(code, bits, lanes)`` to numpy dtypes and TVM's dtype strings
("float32", "int8", "bool", ...).  Every layer uses it: the RPC codec (DLDataType and
DLDevice values, DLTensor headers), the loader (NDArray headers in param dicts) and the
executor (graph JSON ``dltype`` attributes, ExampleJSON ``dtype:`` sections).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import numpy as np


class DLDataTypeCode(enum.IntEnum):
    """DLPack ``DLDataTypeCode`` values (``dlpack.h``)."""

    INT = 0
    UINT = 1
    FLOAT = 2
    OPAQUE_HANDLE = 3
    BFLOAT = 4
    COMPLEX = 5
    BOOL = 6


class DLDeviceType(enum.IntEnum):
    """DLPack device types that matter to a board server."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    VPI = 9
    ROCM = 10
    ROCM_HOST = 11
    EXT_DEV = 12
    CUDA_MANAGED = 13
    ONEAPI = 14
    WEBGPU = 15
    HEXAGON = 16


#: devices whose memory this server can hold (plain host memory)
HOST_DEVICE_TYPES = frozenset({DLDeviceType.CPU, DLDeviceType.EXT_DEV, DLDeviceType.CUDA_HOST})

_NAME_BY_CODE = {
    DLDataTypeCode.INT: "int",
    DLDataTypeCode.UINT: "uint",
    DLDataTypeCode.FLOAT: "float",
    DLDataTypeCode.OPAQUE_HANDLE: "handle",
    DLDataTypeCode.BFLOAT: "bfloat",
    DLDataTypeCode.COMPLEX: "complex",
}
_CODE_BY_NAME = {v: k for k, v in _NAME_BY_CODE.items()}
#: (numpy dtype, ffi) -> its DataType (``DataType.from_numpy``: asked per tensor argument of native calls)
_FROM_NUMPY: dict = {}
_DTYPE_RE = re.compile(r"^(int|uint|float|bfloat|handle|complex)(\d*)(?:x(\d+))?$")


@dataclass(frozen=True)
class DataType:
    """A DLPack ``DLDataType``: type code, bits per lane, lanes."""

    code: int
    bits: int
    lanes: int = 1

    @classmethod
    def parse(cls, text: str) -> "DataType":
        """Parse TVM's dtype string ("float32", "int64", "bool", "float32x4")."""
        if text == "bool":
            return cls(DLDataTypeCode.UINT, 1, 1)
        m = _DTYPE_RE.match(text)
        if not m:
            raise ValueError(f"unknown dtype string {text!r}")
        name, bits, lanes = m.group(1), m.group(2), m.group(3)
        default_bits = 64 if name == "handle" else 32
        return cls(_CODE_BY_NAME[name], int(bits) if bits else default_bits, int(lanes) if lanes else 1)

    @classmethod
    def from_numpy(cls, dtype, ffi: bool = False) -> "DataType":
        """The DataType TVM uses for a numpy dtype.  The one rule for booleans: classic TVM's ``uint1``,
        tvm-ffi's ``kDLBool`` of 8 bits (``ffi``: what tvm-ffi clients and compiled kernels take)."""
        dt = np.dtype(dtype)
        found = _FROM_NUMPY.get((dt, ffi))
        if found is not None:
            return found
        if dt == np.bool_:
            found = cls(DLDataTypeCode.BOOL, 8, 1) if ffi else cls(DLDataTypeCode.UINT, 1, 1)
        else:
            kind = {"i": DLDataTypeCode.INT, "u": DLDataTypeCode.UINT, "f": DLDataTypeCode.FLOAT,
                    "c": DLDataTypeCode.COMPLEX}.get(dt.kind)
            if kind is None:
                raise ValueError(f"numpy dtype {dt} has no DLPack equivalent")
            found = cls(kind, dt.itemsize * 8, 1)
        _FROM_NUMPY[(dt, ffi)] = found
        return found

    @property
    def is_bool(self) -> bool:
        return (self.code == DLDataTypeCode.UINT and self.bits == 1) or self.code == DLDataTypeCode.BOOL

    @property
    def itemsize(self) -> int:
        """Bytes one element takes in memory (sub-byte types round up to one byte each lane)."""
        return ((self.bits + 7) // 8) * self.lanes

    def numpy(self) -> np.dtype:
        """The numpy dtype with this memory layout; raises ValueError when there is none."""
        if self.lanes != 1:
            raise ValueError(f"vector dtype {self} has no numpy equivalent")
        if self.is_bool:
            return np.dtype(np.bool_)
        try:
            if self.code == DLDataTypeCode.INT and self.bits in (8, 16, 32, 64):
                return np.dtype(f"int{self.bits}")
            if self.code == DLDataTypeCode.UINT and self.bits in (8, 16, 32, 64):
                return np.dtype(f"uint{self.bits}")
            if self.code == DLDataTypeCode.FLOAT and self.bits in (16, 32, 64):
                return np.dtype(f"float{self.bits}")
            if self.code == DLDataTypeCode.COMPLEX and self.bits in (64, 128):
                return np.dtype(f"complex{self.bits}")
            if self.code == DLDataTypeCode.BFLOAT and self.bits == 16:
                import ml_dtypes  # optional: ships with apache-tvm

                return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            pass
        raise ValueError(f"dtype {self} has no numpy equivalent here")

    def __str__(self) -> str:
        if self.is_bool:
            return "bool"
        name = _NAME_BY_CODE.get(self.code, f"code{self.code}_")
        text = f"{name}{self.bits}"
        return text if self.lanes == 1 else f"{text}x{self.lanes}"


@dataclass(frozen=True)
class Device:
    """A DLPack ``DLDevice``: device type and id (no RPC session mask)."""

    device_type: int
    device_id: int = 0

    def __str__(self) -> str:
        try:
            name = DLDeviceType(self.device_type).name.lower()
        except ValueError:
            name = f"device{self.device_type}"
        return f"{name}({self.device_id})"


def dtype_str(dtype) -> str:
    """TVM's dtype string for a numpy dtype, DataType or string."""
    if isinstance(dtype, DataType):
        return str(dtype)
    if isinstance(dtype, str) and dtype == "bool":
        return "bool"
    return str(DataType.from_numpy(dtype))


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype for a TVM dtype string, DataType or numpy dtype."""
    if isinstance(dtype, DataType):
        return dtype.numpy()
    if isinstance(dtype, str):
        return DataType.parse(dtype).numpy()
    return np.dtype(dtype)
