"""DLPack's structures as TVM puts them on the wire and in files, declared once with construct.

* ``DLDataType``: ``u8 code, u8 bits, u16 lanes``;
* ``DLDevice``: ``i32 device_type, i32 device_id``;
* ``DLTensor`` (on the RPC wire, ``rpc_reference.h``): ``u64 data, DLDevice, i32 ndim, DLDataType,
  i64 shape[ndim], u64 byte_offset`` (strides never travel);
* as a packed-argument value a DLDataType fills one 8-byte slot (``DLDataTypeValue``).

The loader's NDArray header (``rpcsrv.loader.formats``) is built from the same DLDataType and DLDevice.

The RPC codec parses these for every tensor argument; construct's parser costs microseconds per
call there, so :func:`fixed_struct` derives a ``struct.Struct`` from a fixed-size declaration (same
fields, same order, one format string) and the codec uses that on its hot path.  Tests check that
both forms agree byte for byte.
"""

from __future__ import annotations

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


DTYPE = fixed_struct(DLDataType)
DTYPE_VALUE = fixed_struct(DLDataTypeValue)
DEVICE = fixed_struct(DLDevice)
TENSOR_HEAD = fixed_struct(DLTensorHead)
