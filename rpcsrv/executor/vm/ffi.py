"""Calling TIR kernels compiled into a library: the tvm-ffi safe-call ABI through ctypes.

Every Relax kernel in ``_lib`` is exported as ``int __tvm_ffi_<name>(void *self, const TVMFFIAny
*args, int32_t num_args, TVMFFIAny *result)`` (tvm-ffi ``c_api.h``).  A ``TVMFFIAny`` is 16 bytes:
``i32`` type index, 4 bytes of padding, then an 8-byte value, so an argument array is simply an
``int64`` array of twice the argument count: [type index, value, type index, value, ...].
Tensors travel as ``DLTensor*`` (type index 7, which compiled kernels accept next to Tensor
objects), integers as 1, floats as 3 (the double's bits), booleans as 2, null as 0.

A non-zero return means the kernel raised an error; its kind and message come from
``TVMFFIErrorMoveFromRaised`` in libtvm_ffi, which the kernels' own error reporting
(``TVMFFIErrorSetRaisedFromCStrParts``) writes to.

This module loads the library with ctypes in this process (``load_kernels``) until the native
host of ``rpcsrv.native`` runs it in a worker; the DLTensor and argument encoding stay here.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Any, Callable, Optional

import numpy as np

from ...protocol.dtypes import DataType


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataTypeC(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataTypeC), ("shape_addr", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


_CPU = DLDevice(1, 0)


class _ByteArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _ErrorCell(ctypes.Structure):  # follows the 24-byte object header
    _fields_ = [("kind", _ByteArray), ("message", _ByteArray), ("backtrace", _ByteArray)]


T_NONE, T_INT, T_BOOL, T_FLOAT, T_OPAQUE, T_DATATYPE, T_DEVICE, T_DLTENSOR = 0, 1, 2, 3, 4, 5, 6, 7

SafeCall = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)


_DL_DTYPES: dict[np.dtype, tuple[int, int, int]] = {}


def _dl_dtype(dtype: np.dtype) -> tuple[int, int, int]:
    code = _DL_DTYPES.get(dtype)
    if code is None:
        dt = DataType.from_numpy(dtype)
        code = _DL_DTYPES[dtype] = (int(dt.code), 8 if dt.is_bool else dt.bits, dt.lanes)
    return code


def make_dltensor(arr: np.ndarray) -> DLTensor:
    """A DLTensor over ``arr``'s memory (C-contiguous, CPU); it keeps its shape array alive."""
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    t = DLTensor(arr.__array_interface__["data"][0] if arr.size else 0, _CPU, arr.ndim,
                 DLDataTypeC(*_dl_dtype(arr.dtype)), None, None, 0)
    t.shape_addr = ctypes.addressof(shape)
    t._keep = (shape, arr)
    return t


def _float_bits(v: float) -> int:
    return struct.unpack("<q", struct.pack("<d", v))[0]


def encode_value(v: Any, keep: list) -> tuple[int, int]:
    """(type index, value word) of one argument; ``keep`` holds what must outlive the call."""
    make_dl = getattr(v, "make_dl", None)
    if make_dl is not None:
        return T_DLTENSOR, v.dla or make_dl()
    if v is None:
        return T_NONE, 0
    if isinstance(v, bool):
        return T_BOOL, int(v)
    if isinstance(v, (int, np.integer)):
        return T_INT, int(v)
    if isinstance(v, (float, np.floating)):
        return T_FLOAT, _float_bits(float(v))
    if isinstance(v, np.ndarray):
        t = make_dltensor(np.ascontiguousarray(v))
        keep.append(t)
        return T_DLTENSOR, ctypes.addressof(t)
    if isinstance(v, DataType):
        return T_DATATYPE, v.code | (v.bits << 8) | (v.lanes << 16)
    raise TypeError(f"a {type(v).__name__} cannot be passed to a native kernel")


_Result = ctypes.c_int64 * 2


class KernelError(RuntimeError):
    """A native kernel reported an error (its kind and message)."""


class NativeKernel:
    """One ``__tvm_ffi_<name>`` function; calling it runs the kernel on the given values."""

    __slots__ = ("name", "fn", "lib")

    def __init__(self, name: str, address: int, lib: "KernelLibrary"):
        self.name = name
        self.fn = SafeCall(address)
        self.lib = lib

    def __call__(self, *args: Any) -> Any:
        keep: list = []
        words: list[int] = []
        for v in args:
            words.extend(encode_value(v, keep))
        return self.call_words(words, len(args))

    def call_words(self, words: list[int], nargs: int) -> Any:
        """Call with the argument array given as [type index, value, ...] words."""
        argv = (ctypes.c_int64 * max(len(words), 2))(*words)
        result = _Result()
        rc = self.fn(None, argv, nargs, result)
        if rc != 0:
            raise KernelError(f"kernel {self.name}: {self.lib.take_error()}")
        if result[0] == T_INT:
            return int(result[1])
        if result[0] == T_FLOAT:
            return struct.unpack("<d", struct.pack("<q", result[1]))[0]
        return None


class KernelLibrary:
    """A library's kernels, loaded into this process with libtvm_ffi providing the error hooks."""

    def __init__(self, path: str, symbols: Optional[set[str]] = None):
        self.ffi = _load_tvm_ffi()
        self.lib = ctypes.CDLL(os.path.abspath(path), mode=ctypes.RTLD_LOCAL)
        self.symbols = symbols
        self._cache: dict[str, NativeKernel] = {}
        self._hooks = _fill_hooks(self.lib, self.ffi)

    def get(self, name: str) -> Optional[NativeKernel]:
        symbol = f"__tvm_ffi_{name}"
        if self.symbols is not None and symbol not in self.symbols:
            return None
        kernel = self._cache.get(name)
        if kernel is None:
            try:
                address = ctypes.cast(getattr(self.lib, symbol), ctypes.c_void_p).value
            except AttributeError:
                return None
            kernel = self._cache[name] = NativeKernel(name, address, self)
        return kernel

    def take_error(self) -> str:
        handle = ctypes.c_void_p()
        self.ffi.TVMFFIErrorMoveFromRaised(ctypes.byref(handle))
        if not handle.value:
            return "failed (no error message)"
        cell = _ErrorCell.from_address(handle.value + 24)
        kind = ctypes.string_at(cell.kind.data, cell.kind.size).decode("utf-8", "replace")
        message = ctypes.string_at(cell.message.data, cell.message.size).decode("utf-8", "replace")
        self.ffi.TVMFFIObjectDecRef(handle)
        return f"{kind}: {message}"


_AllocWorkspace = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_int,
                                   ctypes.c_int)
_FreeWorkspace = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_ParallelLambda = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_ParallelLaunch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
_ParallelBarrier = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


class _ParallelEnv(ctypes.Structure):
    _fields_ = [("sync_handle", ctypes.c_void_p), ("num_task", ctypes.c_int32)]


def _fill_hooks(lib, ffi) -> list:
    """Fill the runtime hooks compiled code calls through function-pointer globals (TVM's
    ``InitContextFunctions``): workspace allocation (64-byte aligned malloc), parallel launch (the
    tasks run one after the other in this thread) and error reporting.  Returns what must stay alive."""
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype, libc.aligned_alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def alloc(_dev_type, _dev_id, nbytes, _code, _bits):
        return libc.aligned_alloc(64, max(64, (nbytes + 63) // 64 * 64))

    def free(_dev_type, _dev_id, ptr):
        libc.free(ptr)
        return 0

    def launch(flambda, cdata, _num_task):
        fn = _ParallelLambda(flambda)
        env = _ParallelEnv(None, 1)
        return fn(0, ctypes.addressof(env), cdata)

    hooks = {"__TVMBackendAllocWorkspace": _AllocWorkspace(alloc),
             "__TVMBackendFreeWorkspace": _FreeWorkspace(free),
             "__TVMBackendParallelLaunch": _ParallelLaunch(launch),
             "__TVMBackendParallelBarrier": _ParallelBarrier(lambda _task, _env: 0)}
    for name, callback in hooks.items():
        try:
            ctypes.c_void_p.in_dll(lib, name).value = ctypes.cast(callback, ctypes.c_void_p).value
        except ValueError:
            pass  # the library does not use this hook
    try:
        ctypes.c_void_p.in_dll(lib, "__TVMFFIErrorSetRaisedFromCStr").value = ctypes.cast(
            ffi.TVMFFIErrorSetRaisedFromCStr, ctypes.c_void_p).value
    except ValueError:
        pass
    return list(hooks.values())


_FFI: dict[str, Any] = {}


def _load_tvm_ffi():
    """libtvm_ffi (from the apache-tvm-ffi wheel), loaded globally so kernels resolve against it."""
    if "lib" not in _FFI:
        path = os.environ.get("RPCSRV_TVM_FFI_LIB")
        if not path:
            import importlib.util  # the wheel's shared library only, without importing the package

            spec = importlib.util.find_spec("tvm_ffi")
            for folder in (spec.submodule_search_locations or []) if spec else []:
                candidate = os.path.join(folder, "lib", "libtvm_ffi.so")
                if os.path.exists(candidate):
                    path = candidate
            if not path:
                raise KernelError("native kernels need libtvm_ffi.so (install apache-tvm-ffi or set "
                                  "RPCSRV_TVM_FFI_LIB)")
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        lib.TVMFFIErrorMoveFromRaised.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.TVMFFIErrorMoveFromRaised.restype = None
        lib.TVMFFIObjectDecRef.argtypes = [ctypes.c_void_p]
        _FFI["lib"] = lib
    return _FFI["lib"]


def load_kernels(path: str, symbols: Optional[set[str]] = None) -> Callable[[str], Optional[NativeKernel]]:
    """name -> kernel lookup over the library at ``path``."""
    return KernelLibrary(path, symbols).get
