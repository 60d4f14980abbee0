"""DLPack's structures as TVM puts them on the wire and in files, declared once with construct.

* ``DLDataType``: ``u8 code, u8 bits, u16 lanes``;
* ``DLDevice``: ``i32 device_type, i32 device_id``;
* ``DLTensor`` (on the RPC wire, ``rpc_reference.h``): ``u64 data, DLDevice, i32 ndim, DLDataType,
  i64 shape[ndim], u64 byte_offset`` (strides never travel);
* as a packed-argument value a DLDataType fills one 8-byte slot (``DLDataTypeValue``).

The loader's NDArray header (``rpcsrv.loader.formats``) is built from the same DLDataType and DLDevice.
In memory, where compiled code reads them (``DLTensorInMemory``: the data, shape and strides as pointers),
the native layer and the Relax VM pass them as ctypes structures derived here from the same declarations
(:func:`c_struct`: ``DLDeviceC``, ``DLDataTypeC``, ``DLTensorC``), never declared a second time.

The RPC codec parses these for every tensor argument; construct's parser costs microseconds per
call there, so :func:`fixed_struct` derives a ``struct.Struct`` from a fixed-size declaration (same
fields, same order, one format string) and the codec uses that on its hot path.  Tests check that
both forms agree byte for byte.
"""

from __future__ import annotations

import ctypes
import struct

from construct import Array, Construct, FormatField, Int8ul, Int16ul, Int32sl, Int64sl, Int64ul, Padded, Struct, this
from construct.core import Renamed

DLDataType = Struct("code" / Int8ul, "bits" / Int8ul, "lanes" / Int16ul)
DLDevice = Struct("device_type" / Int32sl, "device_id" / Int32sl)
#: a DLDataType as a packed-argument value: an 8-byte slot, the last 4 bytes unused
DLDataTypeValue = Struct("dtype" / DLDataType, Padded(4, Struct()))
DLTensor = Struct(
    "data" / Int64ul,
    "device" / DLDevice,
    "ndim" / Int32sl,
    "dtype" / DLDataType,
    "shape" / Array(this.ndim, Int64sl),
    "byte_offset" / Int64ul,
)
#: the fixed-size fields of a DLTensor before its shape
DLTensorHead = Struct(*DLTensor.subcons[:4])
#: a DLTensor in memory (``dlpack.h``): the wire form's head, then the shape and strides as pointers (the
#: fields of :data:`POINTERS`: 64-bit here, the machine's own size in the derived ctypes structure)
DLTensorInMemory = Struct(*DLTensor.subcons[:4], "shape" / Int64ul, "strides" / Int64ul, "byte_offset" / Int64ul)
POINTERS = frozenset({"data", "shape", "strides"})


def _format(con: Construct) -> str:
    """struct format characters (without byte order) of a fixed-size construct declaration."""
    if isinstance(con, Renamed):
        return _format(con.subcon)
    if isinstance(con, FormatField):
        if con.fmtstr[0] != "<":
            raise TypeError(f"{con} is not little-endian")
        return con.fmtstr[1:]
    if isinstance(con, Struct):
        return "".join(_format(sc) for sc in con.subcons)
    if isinstance(con, Padded):
        inner = _format(con.subcon)
        pad = con.length - struct.calcsize("<" + inner)
        return inner + (f"{pad}x" if pad else "")
    raise TypeError(f"no fixed struct layout for {con!r}")


def fixed_struct(con: Construct) -> struct.Struct:
    """The ``struct.Struct`` with the layout of fixed-size declaration ``con`` (its leaves in order)."""
    return struct.Struct("<" + _format(con))


_C_TYPES = {"B": ctypes.c_uint8, "H": ctypes.c_uint16, "l": ctypes.c_int32, "L": ctypes.c_uint32,
            "q": ctypes.c_int64, "Q": ctypes.c_uint64, "d": ctypes.c_double}
_C_STRUCTS: dict[int, type] = {}


def c_struct(con: Struct, name: str) -> type:
    """The ctypes structure of fixed-size declaration ``con`` (its fields in order, nested declarations as
    nested structures, the fields of :data:`POINTERS` as ``c_void_p``), made once per declaration."""
    made = _C_STRUCTS.get(id(con))
    if made is None:
        fields = []
        for sub in con.subcons:
            inner = sub.subcon if isinstance(sub, Renamed) else sub
            if sub.name in POINTERS:
                fields.append((sub.name, ctypes.c_void_p))
            elif isinstance(inner, Struct):
                fields.append((sub.name, c_struct(inner, sub.name)))
            else:
                fields.append((sub.name, _C_TYPES[_format(inner)]))
        made = _C_STRUCTS[id(con)] = type(name, (ctypes.Structure,), {"_fields_": fields})
    return made


DLDeviceC = c_struct(DLDevice, "DLDevice")
DLDataTypeC = c_struct(DLDataType, "DLDataType")
DLTensorC = c_struct(DLTensorInMemory, "DLTensor")

DTYPE = fixed_struct(DLDataType)
DTYPE_VALUE = fixed_struct(DLDataTypeValue)
DEVICE = fixed_struct(DLDevice)
TENSOR_HEAD = fixed_struct(DLTensorHead)
