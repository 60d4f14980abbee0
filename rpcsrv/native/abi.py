"""The C structures native TVM code exchanges besides DLPack's, declared once with ctypes.

DLPack's own (``DLDevice``, ``DLDataType``, ``DLTensor``) are derived from the protocol's declarations
(``rpcsrv.protocol.structs``: ``DLDeviceC``, ``DLDataTypeC``, ``DLTensorC``).  Facts from TVM's headers (read,
not copied): ``c_runtime_api.h`` of TVM <= 0.20 (``TVMValue`` and the classic type codes) and tvm-ffi's
``c_api.h`` (``TVMFFIAny``, its type indices, the object header and the shape cell).
"""

from __future__ import annotations

import ctypes
from ctypes import (CFUNCTYPE, POINTER, Structure, Union, c_char_p, c_double, c_int, c_int32, c_int64, c_uint32,
                    c_uint64, c_void_p)

from ..protocol.structs import DLDataTypeC, DLDeviceC, DLTensorC  # noqa: F401  (re-exported: the ABI's structs)


class TVMValue(Union):
    """Classic packed argument value (8 bytes)."""

    _fields_ = [("v_int64", c_int64), ("v_float64", c_double), ("v_handle", c_void_p), ("v_str", c_char_p),
                ("v_type", DLDataTypeC), ("v_device", DLDeviceC)]


class _AnyValue(Union):
    _fields_ = [("v_int64", c_int64), ("v_float64", c_double), ("v_ptr", c_void_p), ("v_c_str", c_char_p),
                ("v_dtype", DLDataTypeC), ("v_device", DLDeviceC), ("v_bytes", ctypes.c_char * 8)]


class TVMFFIAny(Structure):
    """tvm-ffi's on-stack value: type index, 4 bytes padding, 8 bytes value (16 bytes)."""

    _anonymous_ = ("v",)
    _fields_ = [("type_index", c_int32), ("zero_padding", c_uint32), ("v", _AnyValue)]


class TVMFFIObject(Structure):
    """The header in front of every tvm-ffi object (ref counts, type index, deleter)."""

    _fields_ = [("combined_ref_count", c_uint64), ("type_index", c_int32), ("padding", c_uint32),
                ("deleter", c_void_p)]


class ShapeObject(Structure):
    """A ``ffi.Shape`` as compiled code reads it: the object header, then data pointer and size."""

    _fields_ = [("header", TVMFFIObject), ("data", POINTER(c_int64)), ("size", ctypes.c_size_t)]


class TVMParallelGroupEnv(Structure):
    _fields_ = [("sync_handle", c_void_p), ("num_task", c_int32)]


# classic type codes (c_runtime_api.h, TVM <= 0.20)
class Classic:
    INT, UINT, FLOAT, HANDLE, NULL, DATATYPE, DEVICE, DLTENSOR = 0, 1, 2, 3, 4, 5, 6, 7
    OBJECT, MODULE, FUNC, STR, BYTES, NDARRAY = 8, 9, 10, 11, 12, 13


# tvm-ffi type indices (c_api.h)
class FFI:
    NONE, INT, BOOL, FLOAT, OPAQUE_PTR, DATATYPE, DEVICE, DLTENSOR_PTR, RAW_STR = 0, 1, 2, 3, 4, 5, 6, 7, 8
    STATIC_OBJECT_BEGIN, SHAPE, TENSOR = 64, 69, 70


# int f(TVMValue* args, int* type_codes, int n, TVMValue* ret, int* ret_code, void* resource)
ClassicPackedFunc = CFUNCTYPE(c_int, POINTER(TVMValue), POINTER(c_int), c_int, POINTER(TVMValue), POINTER(c_int),
                              c_void_p)
# int f(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result)
SafeCallFunc = CFUNCTYPE(c_int, c_void_p, POINTER(TVMFFIAny), c_int32, POINTER(TVMFFIAny))
# rpcsrv's lookup hook: int lookup(void* ctx, const char* name, void** out)
LookupFunc = CFUNCTYPE(c_int, c_void_p, c_char_p, POINTER(c_void_p))


class FunctionHandle(Structure):
    """What the shim's TVMFuncCall/TVMFFIFunctionCall receive: the ABI (1 classic, 2 tvm-ffi) and address."""

    _fields_ = [("abi", c_int), ("fptr", c_void_p)]


ABI_CLASSIC, ABI_FFI = 1, 2
