"""One client's session: its handles, device memory and workspace, and the answers to its requests.

A session is the server side of one connection.  It turns protocol events into answers and owns
everything the client can name:

* data handles → host buffers (``DevAllocData``; tensors the server returns);
* object handles → packed functions, modules and NDArrays it handed out.

Handles are capabilities: they are random-looking 64-bit values valid in this session only; an unknown
handle is an error answer, never a crash.  Every error a request causes becomes an RPC exception with a
message; the session goes on.  Heavy calls (module functions: inference, loading) run in a worker
thread via ``trio.to_thread`` so other sessions keep being served.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import trio

from .executor.runtime import RuntimeModule
from .native.host import NativeSession
from .protocol import (BadPacket, CallFunc, CallFuncEnd, CallFuncStart, Connection, CopyFromRemote,
                       CopyToRemote, DataType, Device,
                       DeviceAttrKind, Dialect, FunctionHandle, Handle, InitServer, ModuleHandle,
                       ObjectHandle, OpaqueHandle, RemoteTensor, RPCCode, Syscall, TensorHeader,
                       pack_return)
from .protocol.codes import PROTOCOL_VERSION
from .protocol.dtypes import HOST_DEVICE_TYPES, DLDataTypeCode
from .streaming import StreamedCall
from .workspace import Workspace

log = logging.getLogger("rpcsrv.session")


class RPCUserError(RuntimeError):
    """An error answered to the client as an RPC exception (bad handle, bad argument, ...)."""


@dataclass
class Limits:
    """Per-session budgets (bytes)."""

    max_memory: int = 4 << 30
    max_workspace: int = 4 << 30


@dataclass
class NDArrayRef:
    """An NDArray the server handed out: its array and the data handle that names its memory."""

    array: np.ndarray
    data_handle: int


@dataclass
class PackedFunction:
    """A function handed out to the client; ``blocking`` ones run in a worker thread.

    ``stream``: for a function whose last argument is bytes and which returns nothing (an upload), a
    factory ``stream(*other_args, nbytes)`` of a sink (``write(piece)``, ``commit()``, ``abort()``)
    that takes those bytes piece by piece as they arrive, so a large call never sits in memory whole.
    """

    fn: Callable[..., Any]
    name: str
    blocking: bool = True
    stream: Optional[Callable[..., Any]] = None


class Session:
    def __init__(self, conn: Connection, workspace: Workspace, registry, limits: Limits | None = None,
                 peer: str = "?"):
        self.conn = conn
        self.workspace = workspace
        self.registry = registry
        self.limits = limits or Limits()
        self.peer = peer
        self.buffers: dict[int, np.ndarray] = {}
        self.allocated: dict[int, int] = {}
        self.globals: dict[str, int] = {}  # global function name -> its handle
        self.refs: dict[int, int] = {}  # handle -> times handed out, when more than once
        self.objects: dict[int, Any] = {}
        self.memory_used = 0
        self._next = 0x7E0000000000 + (secrets.randbits(24) << 12)
        self.initialized = False
        self._stream: Optional[StreamedCall] = None  # the streamed call in progress (see open_stream)
        self.errors = 0  # requests answered with an exception (for the per-session log line)
        self.native = NativeSession("isolated", self.limits.max_memory)  # the server sets its policy

    # ------------------------------------------------------------------ handles
    def _new_handle(self) -> int:
        self._next += 0x40
        return self._next

    def put_object(self, obj: Any) -> int:
        h = self._new_handle()
        self.objects[h] = obj
        return h

    def get_object(self, handle: int, kind: type | tuple, what: str) -> Any:
        obj = self.objects.get(handle)
        if obj is None or not isinstance(obj, kind):
            raise RPCUserError(f"unknown {what} handle 0x{handle:x} (not issued by this session, or freed)")
        return obj

    def alloc(self, nbytes: int) -> int:
        if nbytes < 0 or self.memory_used + nbytes > self.limits.max_memory:
            raise RPCUserError(f"allocating {nbytes} bytes exceeds this session's memory budget "
                               f"({self.memory_used} of {self.limits.max_memory} bytes in use)")
        h = self._new_handle()
        self.buffers[h] = self.native.zeros(nbytes)  # shared with the native worker once there is one
        self.allocated[h] = nbytes
        self.memory_used += nbytes
        return h

    def free(self, handle: int) -> None:
        nbytes = self.allocated.pop(handle, None)
        if nbytes is None:
            raise RPCUserError(f"unknown data handle 0x{handle:x} (not allocated by this session, or freed)")
        self.native.release(self.buffers.pop(handle))
        self.memory_used -= nbytes

    def tensor_view(self, t: TensorHeader) -> np.ndarray:
        """A numpy view of the remote tensor ``t`` (bounds- and device-checked)."""
        if t.device.device_type not in HOST_DEVICE_TYPES:
            raise RPCUserError(f"device {t.device} is not available on this board (cpu and ext_dev only)")
        buf = self.buffers.get(t.data)
        if buf is None:
            raise RPCUserError(f"unknown data handle 0x{t.data:x} in tensor argument")
        try:
            dtype = t.dtype.numpy()
        except ValueError as exc:
            raise RPCUserError(str(exc)) from None
        nbytes = int(np.prod(t.shape, dtype=np.int64)) * dtype.itemsize
        if t.byte_offset + nbytes > buf.nbytes:
            raise RPCUserError(f"tensor of {nbytes} bytes at offset {t.byte_offset} exceeds its "
                               f"{buf.nbytes}-byte buffer")
        return buf[t.byte_offset:t.byte_offset + nbytes].view(dtype).reshape(t.shape)

    def _dtype_for_client(self, dtype: np.dtype) -> DataType:
        dt = DataType.from_numpy(dtype)
        if dt.is_bool and self.conn.wire_dialect is Dialect.FFI:
            return DataType(DLDataTypeCode.BOOL, 8, 1)
        return dt

    def export_array(self, arr: np.ndarray) -> RemoteTensor:
        """Hand an array to the client as an NDArray (its memory gets a data handle)."""
        arr = np.asarray(arr, order="C")
        raw = arr.reshape(-1).view(np.uint8) if arr.size else np.zeros(0, np.uint8)
        data = self._new_handle()
        self.buffers[data] = raw
        header = TensorHeader(data, Device(1, 0), self._dtype_for_client(arr.dtype), tuple(arr.shape), 0)
        return RemoteTensor(header, self.put_object(NDArrayRef(arr, data)))

    # ------------------------------------------------------------------ values
    def to_local(self, v: Any) -> Any:
        """A wire argument as the Python value functions receive."""
        if isinstance(v, TensorHeader):
            return self.tensor_view(v)
        if isinstance(v, (FunctionHandle, ModuleHandle, ObjectHandle, OpaqueHandle)):
            obj = self.objects.get(v.value)
            if obj is None:
                if isinstance(v, OpaqueHandle):
                    return v  # streams and raw pointers stay opaque
                raise RPCUserError(f"unknown handle 0x{v.value:x} in arguments")
            if isinstance(obj, PackedFunction):
                return obj.fn
            if isinstance(obj, NDArrayRef):
                return obj.array
            return obj
        return v

    def to_wire(self, v: Any) -> Any:
        """A function's result as the value that goes back to the client."""
        if v is None or isinstance(v, (bool, int, float, str, Device, DataType)):
            return v
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v) if isinstance(v, memoryview) else v
        if isinstance(v, np.ndarray):
            return self.export_array(v)
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, RuntimeModule):
            return ModuleHandle(self.put_object(v))
        if isinstance(v, PackedFunction):
            return FunctionHandle(self.put_object(v))
        if callable(v):
            return FunctionHandle(self.put_object(PackedFunction(v, getattr(v, "__name__", "function"))))
        if isinstance(v, (dict, list, tuple)):
            # TVM returns Map/Array results as opaque object handles the client can only pass back
            return ObjectHandle(self.put_object(v))
        raise RPCUserError(f"function returned a {type(v).__name__}, which cannot travel over RPC")

    # ------------------------------------------------------------------ requests
    async def handle(self, event) -> list:
        """The answer (list of buffers) to one request event."""
        try:
            if isinstance(event, CallFunc) and self.initialized:  # the common case first
                return self.conn.send_return(pack_return(await self._call(event), self._dialect))
            if isinstance(event, InitServer):
                return self._init(event)
            if not self.initialized:
                raise RPCUserError("the client must send kInitServer before any other request")
            if isinstance(event, CallFuncEnd):
                stream, self._stream = self._stream, None
                if stream is None:
                    raise RPCUserError("no streamed call in progress")
                await stream.finish()
                return self.conn.send_return(pack_return(None, self._dialect))
            if isinstance(event, Syscall):
                return self.conn.send_return([self.to_wire_syscall(self._syscall(event))])
            if isinstance(event, CopyToRemote):
                self._copy_to(event)
                return self.conn.send_return([None])
            if isinstance(event, CopyFromRemote):
                return self.conn.send_copy_ack(self._copy_from(event))
            if isinstance(event, BadPacket):
                raise RPCUserError(f"bad packet (RPC code {event.code}): {event.error}")
            raise RPCUserError(f"unexpected request {type(event).__name__}")
        except Exception as exc:  # every failure is an answer, never a dead session
            self.errors += 1
            if not isinstance(exc, (RPCUserError, ValueError, TypeError, KeyError, IndexError,
                                    FileNotFoundError, PermissionError, RuntimeError)):
                log.exception("internal error serving %s", self.peer)
            return self.conn.send_exception(_message(exc))

    @property
    def _dialect(self) -> Dialect:
        return self.conn.wire_dialect

    def _init(self, ev: InitServer) -> list:
        if self.initialized:
            raise RPCUserError("the session is already initialized")
        if ev.version != PROTOCOL_VERSION:
            raise RPCUserError(f"client protocol version mismatch: server speaks {PROTOCOL_VERSION}, "
                               f"client speaks {ev.version}")
        if ev.args and ev.args[0] not in ("rpc.LocalSession",):
            raise RPCUserError(f"session constructor {ev.args[0]!r} is not available on this board")
        self.initialized = True
        return self.conn.send_init_reply()

    async def _call(self, ev: CallFunc) -> Any:
        func = self.get_object(ev.handle, PackedFunction, "function")
        args = [self.to_local(a) for a in ev.args]
        if func.blocking:
            result = await trio.to_thread.run_sync(lambda: func.fn(*args))
        else:
            result = func.fn(*args)
        return self.to_wire(result)

    # ------------------------------------------------------------------ streamed calls (uploads)
    def open_stream(self, ev: CallFuncStart) -> bool:
        """Whether ``ev``'s trailing bytes should stream (its function takes them piece by piece)."""
        fn = self.objects.get(ev.handle)
        if not self.initialized or not isinstance(fn, PackedFunction) or fn.stream is None:
            return False
        self._abort_stream()
        try:
            self._stream = StreamedCall(fn.stream(*[self.to_local(a) for a in ev.args], ev.nbytes))
        except Exception as exc:  # answered once the bytes are in (see StreamedCall)
            self._stream = StreamedCall(error=exc)
        return True

    async def stream_piece(self, data: memoryview) -> None:
        """The next piece of the streamed call's bytes."""
        if self._stream is not None:
            await self._stream.piece(data)

    def _abort_stream(self) -> None:
        if self._stream is not None:
            self._stream.abort()
        self._stream = None

    def to_wire_syscall(self, v: Any) -> Any:
        return v

    def _global(self, name: str) -> int:
        """Handle of global function ``name`` (0: none).  Like TVM, asking twice gives the same
        handle, counted: it stays valid until freed as many times as it was handed out."""
        handle = self.globals.get(name)
        if handle is not None:
            self.refs[handle] = self.refs.get(handle, 1) + 1
            return handle
        fn = self.registry.get(name, self)
        if fn is None:
            return 0
        handle = self.put_object(fn)
        self.globals[name] = handle
        return handle

    def _syscall(self, ev: Syscall) -> Any:
        a = ev.args
        code = ev.code
        if code == RPCCode.GET_GLOBAL_FUNC:
            return OpaqueHandle(self._global(_arg(a, 0, str, "function name")))
        if code == RPCCode.FREE_HANDLE:
            handle = _arg(a, 0, Handle, "handle").value
            if handle not in self.objects:
                raise RPCUserError(f"cannot free unknown handle 0x{handle:x}")
            if self.refs.get(handle, 1) > 1:  # a global handed out more than once
                self.refs[handle] -= 1
                return None
            obj = self.objects.pop(handle)
            self.refs.pop(handle, None)
            if isinstance(obj, PackedFunction) and self.globals.get(obj.name) == handle:
                del self.globals[obj.name]
            if isinstance(obj, NDArrayRef):
                self.buffers.pop(obj.data_handle, None)
            return None
        if code in (RPCCode.DEV_SET_DEVICE, RPCCode.DEV_STREAM_SYNC, RPCCode.DEV_FREE_STREAM,
                    RPCCode.DEV_SET_STREAM):
            self._device(a)
            return None
        if code in (RPCCode.DEV_CREATE_STREAM, RPCCode.DEV_GET_CURRENT_STREAM):
            self._device(a)
            return OpaqueHandle(0)  # host devices have no streams: TVM's CPU API returns null too
        if code == RPCCode.DEV_GET_ATTR:
            return self._dev_attr(_arg(a, 0, Device, "device"), _arg(a, 1, int, "attribute kind"))
        if code == RPCCode.DEV_ALLOC_DATA:
            self._device(a)
            return OpaqueHandle(self.alloc(_arg(a, 1, int, "nbytes")))
        if code == RPCCode.DEV_ALLOC_DATA_WITH_SCOPE:
            t = _arg(a, 0, TensorHeader, "tensor")
            scope = a[1] if len(a) > 1 else None
            if scope not in (None, "global"):
                raise RPCUserError(f"memory scope {scope!r} is not supported on this board")
            self._device([t.device])
            return OpaqueHandle(self.alloc(t.nbytes))
        if code == RPCCode.DEV_FREE_DATA:
            self._device(a)
            self.free(_arg(a, 1, Handle, "data pointer").value)
            return None
        if code == RPCCode.COPY_AMONG_REMOTE:
            src = self.tensor_view(_arg(a, 0, TensorHeader, "source tensor"))
            dst = self.tensor_view(_arg(a, 1, TensorHeader, "target tensor"))
            if src.nbytes != dst.nbytes:
                raise RPCUserError(f"copy between tensors of {src.nbytes} and {dst.nbytes} bytes")
            dst.reshape(-1).view(np.uint8)[:] = src.reshape(-1).view(np.uint8)
            return None
        raise RPCUserError(f"syscall {code.name} is not supported")

    def _device(self, args: list) -> Device:
        dev = _arg(args, 0, Device, "device")
        if dev.device_type not in HOST_DEVICE_TYPES:
            raise RPCUserError(f"device {dev} is not available on this board (cpu and ext_dev only)")
        return dev

    def _dev_attr(self, dev: Device, kind: int) -> Any:
        exists = dev.device_type in HOST_DEVICE_TYPES
        if kind == DeviceAttrKind.EXIST:
            return int(exists)
        if not exists:
            raise RPCUserError(f"device {dev} is not available on this board")
        if kind in (DeviceAttrKind.TOTAL_GLOBAL_MEMORY, DeviceAttrKind.AVAILABLE_GLOBAL_MEMORY):
            try:
                return os.sysconf("SC_PAGE_SIZE") * os.sysconf(
                    "SC_PHYS_PAGES" if kind == DeviceAttrKind.TOTAL_GLOBAL_MEMORY else "SC_AVPHYS_PAGES")
            except (ValueError, OSError):
                return None
        if kind == DeviceAttrKind.DEVICE_NAME:
            return "rpcsrv-cpu"
        return None  # TVM's CPU device API leaves other attributes unset

    def copy_target(self, ev) -> tuple[Optional[memoryview], str]:
        """Where a streamed kCopyToRemote body goes (or None and the reason to refuse it)."""
        try:
            return memoryview(self._copy_target(ev.tensor, ev.nbytes)), ""
        except RPCUserError as exc:
            return None, str(exc)

    def _copy_to(self, ev: CopyToRemote) -> None:
        if ev.in_place:
            return  # already received into the buffer named by copy_target
        dst = self._copy_target(ev.tensor, ev.nbytes)
        dst[:] = np.frombuffer(ev.data, dtype=np.uint8)

    def _copy_from(self, ev: CopyFromRemote) -> memoryview:
        return memoryview(self._copy_target(ev.tensor, ev.nbytes))

    def _copy_target(self, t: TensorHeader, nbytes: int) -> np.ndarray:
        if t.device.device_type not in HOST_DEVICE_TYPES:
            raise RPCUserError(f"device {t.device} is not available on this board")
        buf = self.buffers.get(t.data)
        if buf is None:
            raise RPCUserError(f"unknown data handle 0x{t.data:x} in copy")
        if t.byte_offset + nbytes > buf.nbytes:
            raise RPCUserError(f"copy of {nbytes} bytes at offset {t.byte_offset} exceeds the "
                               f"{buf.nbytes}-byte buffer")
        return buf[t.byte_offset:t.byte_offset + nbytes]

    def close(self) -> None:
        """Drop everything the session holds (buffers, modules, workspace)."""
        self._abort_stream()
        self.buffers.clear()
        self.objects.clear()
        self.native.close()
        self.workspace.cleanup()


def _arg(args: list, i: int, kind, what: str):
    if i >= len(args):
        raise RPCUserError(f"missing argument {i} ({what})")
    v = args[i]
    if kind is int and isinstance(v, bool):
        return int(v)
    if not isinstance(v, kind):
        raise RPCUserError(f"argument {i} ({what}) must be {getattr(kind, '__name__', kind)}, "
                           f"got {type(v).__name__}")
    return v


def _message(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    name = type(exc).__name__
    if name in ("RPCUserError", "RuntimeError"):
        return text
    return f"{name}: {text}"
