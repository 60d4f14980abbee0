"""Calling TIR kernels compiled into a library: the tvm-ffi safe-call ABI through ctypes.

Every Relax kernel in ``_lib`` is exported as ``int __tvm_ffi_<name>(void *self, const TVMFFIAny
*args, int32_t num_args, TVMFFIAny *result)`` (tvm-ffi ``c_api.h``).  A ``TVMFFIAny`` is 16 bytes:
``i32`` type index, 4 bytes of padding, then an 8-byte value, so an argument array is simply an
``int64`` array of twice the argument count: [type index, value, type index, value, ...].
Tensors travel as ``DLTensor*`` (type index 7, which compiled kernels accept next to Tensor
objects), integers as 1, floats as 3 (the double's bits), booleans as 2, null as 0.

Loading the library, filling its runtime hooks and reading a failed kernel's message are
``rpcsrv.native``'s job; this module only encodes arguments for the VM's hot loop (a kernel call
is one list copy, one ctypes array and one foreign call).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Callable

import numpy as np

from ...protocol.dtypes import DataType
from ...protocol.structs import DLDataTypeC, DLDeviceC, DLTensorC as DLTensor

_CPU = DLDeviceC(1, 0)


T_NONE, T_INT, T_BOOL, T_FLOAT, T_OPAQUE, T_DATATYPE, T_DEVICE, T_DLTENSOR = 0, 1, 2, 3, 4, 5, 6, 7

SafeCall = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)


def make_dltensor(arr: np.ndarray) -> DLTensor:
    """A DLTensor over ``arr``'s memory (C-contiguous, CPU); it keeps its shape array alive."""
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    dt = DataType.from_numpy(arr.dtype, ffi=True)  # tvm-ffi kernels take booleans as kDLBool of 8 bits
    t = DLTensor(arr.__array_interface__["data"][0] if arr.size else 0, _CPU, arr.ndim,
                 DLDataTypeC(dt.code, dt.bits, dt.lanes), ctypes.addressof(shape), None, 0)
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


class NativeKernel:
    """One tvm-ffi kernel (``__tvm_ffi_<name>`` at ``address``) called with argument words.

    ``fail()`` makes the exception for a non-zero return (the message the kernel set).  Built from an
    ``rpcsrv.native`` function (``from_native``), which loaded the library and filled its hooks."""

    __slots__ = ("name", "fn", "fail")

    def __init__(self, name: str, address: int, fail: Callable[[], Exception]):
        self.name = name
        self.fn = SafeCall(address)
        self.fail = fail

    @classmethod
    def from_native(cls, fn: Any) -> "NativeKernel":
        return cls(fn.name, fn.address, fn._fail)

    def __call__(self, *args: Any) -> Any:
        keep: list = []
        words: list[int] = []
        for v in args:
            words.extend(encode_value(v, keep))
        return self.call_words(words, len(args))

    @staticmethod
    def argv(words: list[int]):
        """The argument array for [type index, value, ...] ``words``."""
        return (ctypes.c_int64 * max(len(words), 2))(*words)

    def call_words(self, words: list[int], nargs: int) -> Any:
        """Call with the argument array given as [type index, value, ...] words."""
        return self.call_argv(self.argv(words), nargs)

    def call_argv(self, argv, nargs: int) -> Any:
        """Call with an argument array from ``argv``."""
        result = _Result()
        if self.fn(None, argv, nargs, result) != 0:
            raise self.fail()
        if result[0] == T_INT:
            return int(result[1])
        if result[0] == T_FLOAT:
            return struct.unpack("<d", struct.pack("<q", result[1]))[0]
        return None
