"""TVM's binary formats, declared once with construct and used to both parse and build.

All of them are dmlc-stream encodings (little-endian whatever the target):

* string / byte string: ``u64`` length, then the bytes;
* vector: ``u64`` count, then the elements;
* NDArray (``SaveDLTensor`` in TVM's ``ndarray.h``): ``u64`` magic ``0xDD5E40F096B4A13F``,
  ``u64`` reserved, DLDevice (``i32`` type, ``i32`` id; always CPU), ``i32`` ndim, DLDataType
  (``u8`` code, ``u8`` bits, ``u16`` lanes), ``i64`` shape[ndim], ``i64`` byte size, the data;
* param dict (``SaveParams``): ``u64`` magic ``0xF7E58D4F05049CB7``, ``u64`` reserved, vector of
  names, ``u64`` count, that many NDArrays;
* module payloads: ``GraphExecutorFactory`` (graph JSON, ``u64`` count, names, NDArrays, module
  name), ``const_loader``/``metadata`` (names, count, NDArrays, symbols, count, one name vector per
  symbol), ``examplejson`` (one string).

Parsing runs over a ``ViewStream``: byte strings come back as memoryview slices and NDArrays as
numpy views over the input, never copies.  Every untrusted length or count is checked against
the bytes that remain before anything is read or allocated; a violation raises ``FormatError``
naming the offset and what was expected (``parse`` below turns it into ``LoaderError``).
"""

from __future__ import annotations

import math

import numpy as np
from construct import (
    Array, Construct, ConstructError, Int32sl, Int64sl, Int64ul, Rebuild, Struct,
    len_, stream_read, this,
)

from ..protocol.dtypes import DataType, DLDeviceType
from ..protocol.structs import DLDataType as DLDataTypeFormat
from ..protocol.structs import DLDevice as DLDeviceFormat
from .errors import LoaderError, ViewStream

NDARRAY_MAGIC = 0xDD5E40F096B4A13F
PARAM_DICT_MAGIC = 0xF7E58D4F05049CB7
#: numpy 2 limit on dimensions (numpy 1 refuses above 32; reported as a LoaderError too)
MAX_NDIM = 64


class FormatError(ConstructError):
    """A field that breaks its format; the message already names the offset."""


def _remaining(stream) -> int:
    if hasattr(stream, "remaining"):
        return stream.remaining()
    here = stream.tell()
    end = stream.seek(0, 2)
    stream.seek(here)
    return end - here


def fail(stream, offset: int, message: str):
    """Raise FormatError for ``message`` at ``offset`` of ``stream`` (reported relative to its base)."""
    raise FormatError(f"{message} (at offset {offset + getattr(stream, 'base', 0)})")


class LenBytes(Construct):
    """dmlc byte string: ``u64`` length then the bytes; parses to a memoryview slice."""

    def _parse(self, stream, context, path):
        start = stream.tell()
        n = Int64ul._parsereport(stream, context, path)
        if n > _remaining(stream):
            fail(stream, start, f"byte string of length {n} runs past the end "
                                f"(expected at most {_remaining(stream)} bytes)")
        return stream_read(stream, n, path)

    def _build(self, obj, stream, context, path):
        data = memoryview(obj).cast("B")
        stream.write(Int64ul.build(len(data)))
        stream.write(data)
        return obj


class Utf8(Construct):
    """dmlc string holding UTF-8 text (type keys, names, graph JSON, ExampleJSON)."""

    def _parse(self, stream, context, path):
        start = stream.tell()
        raw = LenBytes()._parsereport(stream, context, path)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            fail(stream, start, f"string is not UTF-8 ({exc.reason} at byte {exc.start})")

    def _build(self, obj, stream, context, path):
        LenBytes()._build(obj.encode("utf-8"), stream, context, path)
        return obj


class Vector(Construct):
    """dmlc vector: ``u64`` count then the elements (each at least ``min_size`` bytes)."""

    def __init__(self, subcon, min_size: int):
        super().__init__()
        self.subcon, self.min_size = subcon, min_size

    def _parse(self, stream, context, path):
        start = stream.tell()
        n = Int64ul._parsereport(stream, context, path)
        if n * self.min_size > _remaining(stream):
            fail(stream, start, f"vector of {n} elements cannot fit in the "
                                f"{_remaining(stream)} bytes left")
        return [self.subcon._parsereport(stream, context, path) for _ in range(n)]

    def _build(self, obj, stream, context, path):
        stream.write(Int64ul.build(len(obj)))
        for item in obj:
            self.subcon._build(item, stream, context, path)
        return obj


class Expect(Construct):
    """A consistency check between fields already parsed; builds nothing.

    ``message(context)`` describes the violation (called only when the check fails)."""

    def __init__(self, predicate, message):
        super().__init__()
        self.predicate, self.message = predicate, message
        self.flagbuildnone = True

    def _parse(self, stream, context, path):
        if not self.predicate(context):
            fail(stream, stream.tell(), self.message(context))

    def _build(self, obj, stream, context, path):
        return None


class Magic(Construct):
    """A ``u64`` magic number; a mismatch names what the bytes were supposed to be."""

    def __init__(self, value: int, what: str):
        super().__init__()
        self.value, self.what = value, what
        self.flagbuildnone = True

    def _parse(self, stream, context, path):
        start = stream.tell()
        got = Int64ul._parsereport(stream, context, path)
        if got != self.value:
            fail(stream, start, f"bad {self.what} magic 0x{got:016X}, expected 0x{self.value:016X}")
        return got

    def _build(self, obj, stream, context, path):
        stream.write(Int64ul.build(self.value))
        return self.value


NDArrayHeader = Struct(
    "magic" / Int64ul,  # NDARRAY_MAGIC, checked by NDArrayFormat with an offset in the message
    "reserved" / Int64ul,
    "device" / DLDeviceFormat,
    "ndim" / Int32sl,
    "dtype" / DLDataTypeFormat,
)
_HEADER_FAST = NDArrayHeader.compile()  # same declaration, generated parser (~4x faster)
NDARRAY_HEADER_SIZE = NDArrayHeader.sizeof()


def _le(dt: np.dtype) -> np.dtype:
    """``dt`` with little-endian byte order (the file's), a no-op for one-byte types."""
    return dt if dt.itemsize == 1 or dt.byteorder == "<" else dt.newbyteorder("<")


class NDArrayFormat(Construct):
    """One NDArray (TVM's ``SaveDLTensor`` layout); parses to a read-only numpy view."""

    def _parse(self, stream, context, path):
        start = stream.tell()
        if _remaining(stream) < NDARRAY_HEADER_SIZE:  # the generated parser does not check
            fail(stream, start, f"NDArray header runs past the end (expected {NDARRAY_HEADER_SIZE} "
                                f"bytes, {_remaining(stream)} left)")
        head = _HEADER_FAST._parsereport(stream, context, path)
        if head.magic != NDARRAY_MAGIC:
            fail(stream, start, f"bad NDArray magic 0x{head.magic:016X}, expected 0x{NDARRAY_MAGIC:016X}")
        if head.device.device_type != DLDeviceType.CPU:
            fail(stream, start + 16, f"NDArray device type {head.device.device_type}, expected 1 (CPU)")
        if not 0 <= head.ndim <= MAX_NDIM:
            fail(stream, start + 24, f"absurd NDArray ndim {head.ndim}, expected 0..{MAX_NDIM}")
        if 8 * head.ndim + 8 > _remaining(stream):
            fail(stream, start + 32, f"NDArray shape of {head.ndim} dims and its byte size run past the "
                                     f"end (expected {8 * head.ndim + 8} bytes, {_remaining(stream)} left)")
        dtype = DataType(head.dtype.code, head.dtype.bits, head.dtype.lanes)
        try:
            npdt = dtype.numpy()
        except ValueError as exc:
            fail(stream, start + 28, f"unsupported NDArray dtype (code {dtype.code}, bits "
                                     f"{dtype.bits}, lanes {dtype.lanes}): {exc}")
        shape = [int(d) for d in np.frombuffer(stream_read(stream, 8 * head.ndim, path), "<i8")]
        if any(d < 0 for d in shape):
            fail(stream, start + 32, f"negative NDArray shape {shape}")
        count = math.prod(shape)
        size_at = stream.tell()
        nbytes = Int64sl._parsereport(stream, context, path)
        if nbytes != count * npdt.itemsize:
            fail(stream, size_at, f"NDArray byte size {nbytes} does not match shape {shape} of "
                                  f"{dtype} (expected {count * npdt.itemsize})")
        if nbytes > _remaining(stream):
            fail(stream, size_at, f"NDArray data of {nbytes} bytes runs past the end "
                                  f"(expected at most {_remaining(stream)} bytes)")
        data = stream_read(stream, nbytes, path)
        try:
            return np.frombuffer(data, dtype=_le(npdt), count=count).reshape(shape)
        except ValueError as exc:  # e.g. shape (0, 2**62): no bytes, but numpy refuses the shape
            fail(stream, start + 32, f"NDArray shape {shape} not representable: {exc}")

    def _build(self, obj, stream, context, path):
        arr = np.asarray(obj)
        arr = np.require(arr, dtype=_le(arr.dtype), requirements="C")
        dtype = DataType.from_numpy(arr.dtype)
        header = dict(magic=NDARRAY_MAGIC, reserved=0,
                      device=dict(device_type=int(DLDeviceType.CPU), device_id=0),
                      ndim=arr.ndim, dtype=dict(code=dtype.code, bits=dtype.bits, lanes=1))
        NDArrayHeader._build(header, stream, context, path)
        stream.write(np.asarray(arr.shape, "<i8").tobytes())
        stream.write(Int64sl.build(arr.nbytes))
        stream.write(arr.reshape(-1).view(np.uint8).data if arr.nbytes else b"")
        return obj


DmlcBytes = LenBytes()
DmlcString = Utf8()
StringVector = Vector(DmlcString, min_size=8)
U64Vector = Vector(Int64ul, min_size=8)
NDArray = NDArrayFormat()

def _one_per(count: str, names: str, what: str) -> Expect:
    """Check that the count field ``count`` equals the length of the list field ``names``."""
    return Expect(lambda c: c[count] == len(c[names]),
                  lambda c: f"{what}: {c[count]} of them, expected one per entry of {names} "
                            f"({len(c[names])})")


#: TVM's param dict (``tvm.runtime.save_param_dict``)
ParamDict = Struct(
    "magic" / Magic(PARAM_DICT_MAGIC, "param dict"),
    "reserved" / Rebuild(Int64ul, 0),
    "names" / StringVector,
    "count" / Rebuild(Int64ul, len_(this.names)),
    _one_per("count", "names", "param dict: arrays"),
    "arrays" / Array(this.count, NDArray),
)

#: ``GraphExecutorFactory`` (0.7: ``GraphRuntimeFactory``) payload
GraphExecutorFactoryPayload = Struct(
    "graph_json" / DmlcString,
    "count" / Rebuild(Int64ul, len_(this.names)),
    "names" / StringVector,
    _one_per("count", "names", "graph executor factory: params"),
    "arrays" / Array(this.count, NDArray),
    "module_name" / DmlcString,
)

#: ``const_loader`` (0.7-0.8: ``metadata``) payload
ConstLoaderPayload = Struct(
    "names" / StringVector,
    "count" / Rebuild(Int64ul, len_(this.names)),
    _one_per("count", "names", "const loader: arrays"),
    "arrays" / Array(this.count, NDArray),
    "symbols" / StringVector,
    "nsymbols" / Rebuild(Int64ul, len_(this.symbols)),
    _one_per("nsymbols", "symbols", "const loader: constant name lists"),
    "const_vars" / Array(this.nsymbols, StringVector),
)

#: ``examplejson`` payload: the ExampleJSON text
ExampleJSONPayload = DmlcString

#: classic blob ``_import_tree`` entry and the tvm-ffi blob's leading import tree (CSR form)
ImportTree = Struct("row_ptr" / U64Vector, "child_indices" / U64Vector)


def parse(fmt: Construct, data, offset: int = 0, base: int = 0, what: str = "blob"):
    """Parse ``fmt`` from ``data[offset:]``; returns (value, end offset).

    Offsets in errors are ``base + position in data`` (pass the blob's file offset as ``base``).
    Any format violation or short read becomes a ``LoaderError`` naming the offset.
    """
    stream = ViewStream(data, base)
    stream.seek(offset)
    try:
        value = fmt.parse_stream(stream)
    except FormatError as exc:
        raise LoaderError(f"{what}: {_first_line(exc)}") from None
    except ConstructError as exc:
        raise LoaderError(f"{what}: truncated or malformed data at offset {base + stream.tell()}: "
                          f"{_first_line(exc)}") from None
    return value, stream.tell()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    # construct prefixes messages with the parsing path on its own line
    return text.splitlines()[-1] if text else type(exc).__name__


def save_ndarray(arr) -> bytes:
    """One array in TVM's NDArray format (what ``tvm.nd.array(x)`` saves)."""
    return NDArray.build(arr)


def load_ndarray(buf, offset: int = 0) -> tuple[np.ndarray, int]:
    """Parse one NDArray at ``offset`` of ``buf``: (read-only view over ``buf``, end offset)."""
    return parse(NDArray, buf, offset, what="NDArray")


def save_param_dict(params: dict) -> bytes:
    """A param dict in TVM's format (``tvm.runtime.save_param_dict``), names in dict order."""
    names = list(params)
    return ParamDict.build(dict(names=names, arrays=[params[n] for n in names]))


def load_param_dict(data) -> dict[str, np.ndarray]:
    """Parse a param dict; arrays are read-only views over ``data``, not copies."""
    value, _ = parse(ParamDict, data, what="param dict")
    if len(set(value.names)) != len(value.names):
        raise LoaderError("param dict: duplicate parameter names (expected each name once)")
    return dict(zip(value.names, value.arrays))
