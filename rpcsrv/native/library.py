"""Open a host library and call its functions with TVM's calling conventions, without TVM.

``open_library(path)`` checks the library's machine against the board, makes sure every TVM
runtime symbol it needs is provided (by the shim, ``shim.py``), loads it with ``dlopen`` and fills
what TVM's library loaders fill: the ``__<Function>`` pointer globals (workspace, parallel
launch/barrier, errors, function lookup and calls) and the module context (``__tvm_module_ctx``,
``__tvm_ffi__library_ctx``).  ``get_function(name)`` finds

* ``__tvm_ffi_<name>``: tvm-ffi's safe call ``int f(void* self, const TVMFFIAny* args, int32_t n,
  TVMFFIAny* result)`` (TVM >= 0.21);
* otherwise the symbol ``name`` itself, as a classic packed function ``int f(TVMValue* args, int*
  type_codes, int n, TVMValue* ret, int* ret_code, void* resource)`` (TVM <= 0.20); ``__tvm_main__``
  names the entry function (a string symbol).

A call converts numpy arrays to DLTensors over their memory (so the function writes them in
place), ints, floats, bools, None, strings, devices, dtypes, and (tvm-ffi) tuples of ints as
shapes.  A non-zero return raises :class:`NativeError` with the message the function set.

(A little over 400 lines: loading, the hook filling and both calling conventions share the ctypes
state of one open library, and splitting them would pass that state between files.)
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ..executor.module import ExecutorError
from ..protocol.dtypes import DataType, Device
from .abi import (ABI_CLASSIC, ABI_FFI, FFI, Classic, ClassicPackedFunc, DLTensorC, FunctionHandle,
                  LookupFunc, SafeCallFunc, ShapeObject, TVMFFIAny, TVMFFIObject, TVMValue)
from .machine import Machine, board, machine_of
from .shm import address_of
from .shim import CONTEXT_FUNCTIONS, PROVIDED, ShimUnavailable, load_shim

FFI_PREFIX = "__tvm_ffi_"
CLASSIC_MAIN = "__tvm_main__"
_CONTEXT_SYMBOLS = ("__tvm_module_ctx", "__tvm_ffi__library_ctx")


class NativeError(ExecutorError):
    """A native function failed (its message), or a library cannot be loaded here (why)."""


@dataclass
class LibraryInfo:
    """What the ELF file says, before loading: machine, defined functions, undefined symbols."""

    machine: Machine
    functions: list[str]
    undefined: list[str]
    objects: list[str] = field(default_factory=list)  # defined data symbols (hook globals, __tvm_main__)

    @property
    def runtime_symbols(self) -> list[str]:
        """Undefined symbols a TVM runtime would provide."""
        return sorted(s for s in self.undefined if s.startswith("TVM"))

    @property
    def hooks(self) -> list[str]:
        return sorted(s for s in self.objects if s.startswith("__TVM") or s in _CONTEXT_SYMBOLS)

    def public_functions(self) -> list[str]:
        """The functions a client can ask for (tvm-ffi names without their prefix)."""
        ffi = [s[len(FFI_PREFIX):] for s in self.functions
               if s.startswith(FFI_PREFIX) and not s.startswith("__tvm_ffi__")]
        return ffi or [s for s in self.functions if not s.startswith("_")]


def inspect_native(path: str) -> LibraryInfo:
    """Read the library's ELF header and dynamic symbols (NativeError when it is not ELF)."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            machine = machine_of(f)
            functions, undefined, objects = set(), set(), set()
            for sec in elf.iter_sections():
                if not isinstance(sec, SymbolTableSection) or sec.name != ".dynsym":
                    continue
                for sym in sec.iter_symbols():
                    if not sym.name or sym["st_info"]["bind"] == "STB_LOCAL":
                        continue
                    kind = sym["st_info"]["type"]
                    if sym["st_shndx"] == "SHN_UNDEF":
                        undefined.add(sym.name)
                    elif kind == "STT_FUNC":
                        functions.add(sym.name)
                    elif kind in ("STT_OBJECT", "STT_NOTYPE"):
                        objects.add(sym.name)
    except (OSError, ValueError) as exc:
        raise NativeError(f"{path}: cannot read it as a host library ({exc})") from None
    except Exception as exc:  # pyelftools on malformed input
        raise NativeError(f"{path}: malformed ELF file ({type(exc).__name__}: {exc})") from None
    return LibraryInfo(machine, sorted(functions), sorted(undefined), sorted(objects))


# ---------------------------------------------------------------------------- lookups from compiled code
_contexts: dict[int, "NativeLibrary"] = {}
_ids = itertools.count(1)
_ctx_lock = threading.Lock()


def _lookup(ctx: int, name: bytes, out) -> int:
    """The shim's lookup hook: the function ``name`` in the module tree of the library ``ctx``."""
    try:
        lib = _contexts.get(ctx or 0)
        fn = lib.lookup(name.decode()) if lib is not None else None
        out[0] = fn.handle_address if fn is not None else None
        return 0
    except Exception:  # never let a Python error cross into C
        out[0] = None
        return 0


_LOOKUP = LookupFunc(_lookup)


# ---------------------------------------------------------------------------- argument conversion
def dltensor(arr: np.ndarray, abi: int, keep: list) -> DLTensorC:
    """A DLTensor over ``arr``'s memory (strides only when it is not C-contiguous)."""
    shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
    keep.append(shape)
    strides = None
    if not arr.flags.c_contiguous and arr.size > 1:
        if any(s % arr.itemsize for s in arr.strides):
            raise NativeError("an array argument has strides that are not a multiple of its item size")
        strides = (ctypes.c_int64 * arr.ndim)(*(s // arr.itemsize for s in arr.strides))
        keep.append(strides)
    data = arr.__array_interface__["data"][0] if arr.size else None
    dt = DataType.from_numpy(arr.dtype, ffi=abi == ABI_FFI)
    t = DLTensorC(data, (1, 0), arr.ndim, (dt.code, dt.bits, dt.lanes), ctypes.addressof(shape),
                  None if strides is None else ctypes.addressof(strides), 0)
    keep.append(t)
    return t


def _to_any(v: Any, slot: TVMFFIAny, keep: list) -> None:
    slot.zero_padding = 0
    if v is None:
        slot.type_index, slot.v_int64 = FFI.NONE, 0
    elif isinstance(v, np.ndarray):
        slot.type_index, slot.v_ptr = FFI.DLTENSOR_PTR, ctypes.addressof(dltensor(v, ABI_FFI, keep))
    elif isinstance(v, (bool, np.bool_)):
        slot.type_index, slot.v_int64 = FFI.BOOL, int(v)
    elif isinstance(v, (int, np.integer)):
        slot.type_index, slot.v_int64 = FFI.INT, int(v)
    elif isinstance(v, (float, np.floating)):
        slot.type_index, slot.v_float64 = FFI.FLOAT, float(v)
    elif isinstance(v, str):
        raw = ctypes.c_char_p(v.encode())
        keep.append(raw)
        slot.type_index, slot.v_c_str = FFI.RAW_STR, raw.value
    elif isinstance(v, Device):
        slot.type_index = FFI.DEVICE
        slot.v_device.device_type, slot.v_device.device_id = v.device_type, v.device_id
    elif isinstance(v, DataType):
        slot.type_index = FFI.DATATYPE
        slot.v_dtype.code, slot.v_dtype.bits, slot.v_dtype.lanes = int(v.code), v.bits, v.lanes
    elif isinstance(v, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in v):
        data = (ctypes.c_int64 * max(len(v), 1))(*v)
        shape = ShapeObject()
        shape.header.combined_ref_count = 1 << 62  # never freed by compiled code
        shape.header.type_index = FFI.SHAPE
        shape.data, shape.size = ctypes.cast(data, ctypes.POINTER(ctypes.c_int64)), len(v)
        keep += [data, shape]
        slot.type_index, slot.v_ptr = FFI.SHAPE, ctypes.addressof(shape)
    else:
        raise NativeError(f"a {type(v).__name__} cannot be passed to a native function")


def _to_value(v: Any, value: TVMValue, keep: list) -> int:
    """Fill a classic TVMValue; returns the type code."""
    if v is None:
        value.v_handle = None
        return Classic.NULL
    if isinstance(v, np.ndarray):
        value.v_handle = ctypes.addressof(dltensor(v, ABI_CLASSIC, keep))
        return Classic.DLTENSOR
    if isinstance(v, (bool, int, np.integer, np.bool_)):
        value.v_int64 = int(v)
        return Classic.INT
    if isinstance(v, (float, np.floating)):
        value.v_float64 = float(v)
        return Classic.FLOAT
    if isinstance(v, str):
        raw = ctypes.c_char_p(v.encode())
        keep.append(raw)
        value.v_str = raw.value
        return Classic.STR
    if isinstance(v, Device):
        value.v_device.device_type, value.v_device.device_id = v.device_type, v.device_id
        return Classic.DEVICE
    if isinstance(v, DataType):
        value.v_type.code, value.v_type.bits, value.v_type.lanes = int(v.code), v.bits, v.lanes
        return Classic.DATATYPE
    raise NativeError(f"a {type(v).__name__} cannot be passed to a classic packed function")


# ---------------------------------------------------------------------------- functions
class NativeFunction:
    """One native function of a library; calling it converts the arguments (see the module doc)."""

    def __init__(self, library: "NativeLibrary", name: str, symbol: str, abi: int):
        self.library, self.name, self.symbol, self.abi = library, name, symbol, abi
        address = ctypes.cast(getattr(library.dll, symbol), ctypes.c_void_p).value
        self.address = address
        self._ffi = SafeCallFunc(address) if abi == ABI_FFI else None
        self._classic = ClassicPackedFunc(address) if abi == ABI_CLASSIC else None
        self._handle = FunctionHandle(abi, address)  # what compiled code gets from a lookup
        self.handle_address = ctypes.addressof(self._handle)
        self.__name__ = name
        self._recent: dict[tuple, Callable[[], Any]] = {}  # signature -> bound call (``__call__``)

    def __repr__(self) -> str:
        kind = "tvm-ffi" if self.abi == ABI_FFI else "classic packed"
        return f"<NativeFunction {self.name} ({kind}) of {self.library.path}>"

    def _fail(self) -> NativeError:
        message = (self.library.shim.rpcsrv_last_error() or b"").decode("utf-8", "replace")
        self.library.shim.rpcsrv_clear_error()  # each message is read once
        message = message or _tvm_ffi_error()
        return NativeError(f"{self.name}: {message or 'the native function returned an error'}")

    def __call__(self, *args: Any) -> Any:
        """Call with ``args``: the converted arguments of recent signatures are reused (``signature``)."""
        key = signature(args)
        if key is None:
            return self.bind(*args, hold=False, returns=True)()
        bound = self._recent.get(key)
        if bound is None:
            if len(self._recent) >= RECENT:
                self._recent.clear()
            bound = self._recent[key] = self.bind(*args, hold=False, returns=True)
        return bound()

    def bind(self, *args: Any, hold: bool = True, returns: bool = False) -> Callable[[], Any]:
        """A call of this function with these arguments, converted once (graph executor, ``__call__``).
        ``hold``: the call keeps the arrays alive (else only their addresses: the caller keeps them);
        ``returns``: the call returns the function's result (a fresh result cell per call)."""
        keep: list = [args] if hold else []
        n = len(args)
        fail, name = self._fail, self.name
        if self._ffi is not None:
            anys = (TVMFFIAny * max(n, 1))()
            for i, a in enumerate(args):
                _to_any(a, anys[i], keep)
            f, result = self._ffi, TVMFFIAny()

            def call_ffi() -> Any:
                out = TVMFFIAny() if returns else result
                out.type_index = FFI.NONE
                if f(None, anys, n, out) != 0:
                    raise fail()
                return _from_any(out, name) if returns else None
            call_ffi.keep = keep  # the argument structures live as long as the call
            call_ffi.parts = (2, f, anys, None, n, fail)  # for a loop in C (``replay.py``)
            return call_ffi
        values, codes = (TVMValue * max(n, 1))(), (ctypes.c_int * max(n, 1))()
        for i, a in enumerate(args):
            codes[i] = _to_value(a, values[i], keep)
        fc, ret, ret_code = self._classic, TVMValue(), ctypes.c_int(Classic.NULL)

        def call_classic() -> Any:
            if returns:
                out, code = TVMValue(), ctypes.c_int(Classic.NULL)
                if fc(values, codes, n, out, code, None) != 0:
                    raise fail()
                return _from_value(out, code.value, name)
            if fc(values, codes, n, ret, ret_code, None) != 0:
                raise fail()
        call_classic.keep = keep
        call_classic.parts = (1, fc, values, codes, n, fail)
        return call_classic


#: argument signatures whose converted arguments a native function keeps (a tuner calls one kernel
#: with the same few buffers over and over; converting them costs ~30 us a call, a bound call ~1 us)
RECENT = 32


def signature(args: tuple) -> Optional[tuple]:
    """What a call's converted arguments depend on (arrays: address, shape, strides, dtype; plain
    ints, floats, bools, None and strings: type and value), or None for arguments not worth a key."""
    key = []
    for a in args:
        t = type(a)
        if t is np.ndarray:
            key.append((address_of(a), a.shape, a.strides, a.dtype.str))
        elif t in (int, float, bool, str) or a is None:
            key.append((t, a))
        else:
            return None
    return tuple(key)


def _tvm_ffi_error() -> str:
    """The error raised into tvm-ffi's own library, when the process also loaded apache-tvm (its
    ``libtvm_ffi`` was loaded before our shim, so the library's error calls bound to it)."""
    try:
        move = ctypes.CDLL(None).TVMFFIErrorMoveFromRaised
    except AttributeError:
        return ""
    handle = ctypes.c_void_p()
    move.argtypes, move.restype = [ctypes.POINTER(ctypes.c_void_p)], None
    move(ctypes.byref(handle))
    if not handle.value:
        return ""
    cell = handle.value + ctypes.sizeof(TVMFFIObject)  # kind, message: {const char*, size_t} each
    kind_p, kind_n, msg_p, msg_n = (ctypes.c_size_t * 4).from_address(cell)
    kind, message = ctypes.string_at(kind_p, kind_n).decode(), ctypes.string_at(msg_p, msg_n).decode()
    ctypes.CDLL(None).TVMFFIObjectDecRef(handle)
    return f"{kind}: {message}" if kind and kind != "RuntimeError" else message


def _from_any(r: TVMFFIAny, name: str) -> Any:
    if r.type_index == FFI.NONE:
        return None
    if r.type_index == FFI.INT:
        return int(r.v_int64)
    if r.type_index == FFI.BOOL:
        return bool(r.v_int64)
    if r.type_index == FFI.FLOAT:
        return float(r.v_float64)
    raise NativeError(f"{name} returned a value of tvm-ffi type index {r.type_index}, which rpcsrv cannot take")


def _from_value(v: TVMValue, code: int, name: str) -> Any:
    if code == Classic.NULL:
        return None
    if code in (Classic.INT, Classic.UINT):
        return int(v.v_int64)
    if code == Classic.FLOAT:
        return float(v.v_float64)
    raise NativeError(f"{name} returned a value of type code {code}, which rpcsrv cannot take")


# ---------------------------------------------------------------------------- libraries
class NativeLibrary:
    """A loaded host library.  ``root`` is the module tree lookups from compiled code search
    (TVM: the root module, so every symbol is visible); set by whoever builds the tree."""

    def __init__(self, path: str, info: LibraryInfo, dll: ctypes.CDLL, shim: ctypes.CDLL):
        self.path, self.info, self.dll, self.shim = path, info, dll, shim
        self.root: Any = None
        self._functions: dict[str, Optional[NativeFunction]] = {}
        self._ffi = any(s.startswith(FFI_PREFIX) for s in info.functions)
        self._defined = set(info.functions)
        self._ctx = ctypes.c_int64(0)  # its address is the module context compiled code passes back
        with _ctx_lock:
            self.context = ctypes.addressof(self._ctx)
            _contexts[self.context] = self
        self._fill_hooks()

    def _fill_hooks(self) -> None:
        for name in CONTEXT_FUNCTIONS:
            self._set_pointer(f"__{name}", ctypes.cast(getattr(self.shim, name), ctypes.c_void_p).value)
        for symbol in _CONTEXT_SYMBOLS:
            self._set_pointer(symbol, self.context)

    def _set_pointer(self, symbol: str, value: int) -> None:
        try:
            ctypes.c_void_p.in_dll(self.dll, symbol).value = value
        except ValueError:  # the library does not have this global
            pass

    def entry_name(self) -> Optional[str]:
        """The classic entry function named by the ``__tvm_main__`` string, if any."""
        try:
            raw = ctypes.c_char.in_dll(self.dll, CLASSIC_MAIN)
        except ValueError:
            return None
        return ctypes.string_at(ctypes.addressof(raw)).decode() or None

    def get_function(self, name: str) -> Optional[NativeFunction]:
        """The native function ``name`` (tvm-ffi or classic), or None."""
        if name in self._functions:
            return self._functions[name]
        fn = None
        if self._ffi:
            if FFI_PREFIX + name in self._defined:
                fn = NativeFunction(self, name, FFI_PREFIX + name, ABI_FFI)
        else:
            symbol = self.entry_name() if name == CLASSIC_MAIN else name
            if symbol and symbol in self._defined and not symbol.startswith("__tvm_ffi"):
                fn = NativeFunction(self, name, symbol, ABI_CLASSIC)
        self._functions[name] = fn
        return fn

    def lookup(self, name: str) -> Optional[NativeFunction]:
        """A function compiled code asks for by name: the module tree's, else this library's."""
        if self.root is not None:
            fn = self.root.find_function(name)
            if isinstance(fn, NativeFunction):
                return fn
        return self.get_function(name)

    def close(self) -> None:
        with _ctx_lock:
            _contexts.pop(self.context, None)


def open_library(path: str, info: LibraryInfo | None = None) -> NativeLibrary:
    """Load ``path`` for calls (see the module doc); NativeError says why it cannot be."""
    info = info or inspect_native(path)
    here = board()
    if not here.runs(info.machine):
        raise NativeError(f"{path}: the library is built for {info.machine}, this board is {here}; its "
                          f"functions cannot run here: {', '.join(info.public_functions()) or 'none'}")
    missing = [s for s in info.runtime_symbols if s not in PROVIDED]
    if missing:
        raise NativeError(f"{path}: needs TVM runtime symbols rpcsrv does not provide: {', '.join(missing)}")
    try:
        shim = load_shim()
    except (ShimUnavailable, OSError) as exc:
        needed = info.runtime_symbols + info.hooks
        raise NativeError(f"{path}: cannot resolve the runtime symbols it needs "
                          f"({', '.join(needed) or 'none beyond the hooks'}): {exc}") from None
    shim.rpcsrv_set_lookup(_LOOKUP)
    try:
        dll = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL | 2)  # RTLD_NOW: unresolved symbols fail here
    except OSError as exc:
        raise NativeError(f"{path}: dlopen failed: {exc}") from None
    return NativeLibrary(path, info, dll, shim)
