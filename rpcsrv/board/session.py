"""One client's session: the answers to its requests, from what it holds.

A session is the server side of one connection.  It turns protocol events into :class:`Answer` values
(a value, an error, or the bytes of a copy); the server encodes them in the connection's dialect.
What the client can name lives in the session's :class:`~rpcsrv.board.handles.HandleTable`, and every byte
the client makes the server hold is charged to the session's :class:`~rpcsrv.board.accounts.MemoryAccount`
(a child of the server-wide one) before it is allocated.

What it does with its board (loading a library, looking a function up, calling it) goes to a backend
(``rpcsrv.native.backend``: this process, or the session's native worker process), chosen for each library by
the board's policy (``Session.native``, a ``NativeSession``) and, for what a library holds, by where it was
loaded (``NativeSession.backend_of``); the session never asks which one it has.

Every error a request causes becomes an RPC exception with a message; the session goes on, except after a call
the board's call timeout cut (``--call-timeout``): its answer says so, then the session ends
(:attr:`Session.ending`).  Heavy calls (module functions: inference, loading) run in a worker thread via
``trio.to_thread``, under the server's thread limiter, so other sessions keep being served; a native
function's backend may give it a runner that the event loop awaits instead (no thread hop).  ``close``
releases everything.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Optional

import numpy as np
import trio

from .accounts import BudgetError, MemoryAccount, RPCUserError
from .answers import INIT_DONE, Answer, CopyData, Failed, Returned, message
from ..executor.memory import ALLOCATION_HOOK
from ..executor.module import RuntimeModule
from .handles import HandleTable, NDArrayRef, PackedFunction
from .limits import Limits
from ..native.host import NativeSession
from ..native.proxy import CallTimeout
from ..protocol import (BadPacket, CallFunc, CallFuncEnd, CallFuncStart, Connection, CopyFromRemote,
                       CopyToRemote, DataType, Device,
                       Dialect, FunctionHandle, InitServer, ModuleHandle,
                       ObjectHandle, OpaqueHandle, RemoteTensor, Syscall, TensorHeader)
from ..protocol.codes import PROTOCOL_VERSION
from ..protocol.dtypes import HOST_DEVICE_TYPES
from .streaming import StreamedCall
from .syscalls import SyscallsMixin
from .workspace import Workspace

log = logging.getLogger("rpcsrv.board.session")

__all__ = ["Answer", "BudgetError", "CopyData", "Failed", "Limits", "NDArrayRef", "PackedFunction",
           "RPCUserError", "Returned", "Session"]


class Session(SyscallsMixin):
    def __init__(self, conn: Connection, workspace: Workspace, registry, limits: Limits | None = None,
                 peer: str = "?", account: Optional[MemoryAccount] = None,
                 limiter: Optional[trio.CapacityLimiter] = None, native: Optional[NativeSession] = None):
        self.conn = conn  # read for the peer's dialect only
        self.registry = registry
        self.limits = limits or Limits()
        self.peer = peer
        self.account = account or MemoryAccount(self.limits.max_memory)
        self.handles = HandleTable(self.account, self.limits.max_handles)
        self.workspace = workspace
        workspace.account = self.account
        self.limiter = limiter
        self.globals: dict[str, int] = {}  # global function name -> its handle
        self.module_functions: dict[int, tuple] = {}  # id(module function) -> (its handle, weakref)
        self.baton: Any = None  # lends the connection for repeated native calls (``baton.py``), once one is made
        self.initialized = False
        self.closed = False
        #: why the session must end once its current answer is sent (a call cut by ``--call-timeout``), else None
        self.ending: Optional[str] = None
        self._stream: Optional[StreamedCall] = None  # the streamed call in progress (see open_stream)
        self.errors = 0  # requests answered with an exception (for the per-session log line)
        self.native = native or NativeSession("isolated", self.limits.max_memory)  # the board's native policy
        self.native.account = self.account  # a native worker and what it holds count for this session
        self.native.workspace = str(workspace.root)  # the only folder its confined worker may write
        self._hook = self._charge_storage  # (one bound method: the allocation hook is known by identity)

    # ------------------------------------------------------------------ compatibility views
    @property
    def objects(self) -> dict[int, Any]:
        return self.handles.objects

    @property
    def buffers(self) -> dict[int, np.ndarray]:
        return self.handles.buffers

    @property
    def memory_used(self) -> int:
        """Bytes this session's account holds (arrays, storage, files, handle entries)."""
        return self.account.used

    # ------------------------------------------------------------------ handles and memory
    def put_object(self, obj: Any) -> int:
        return self.handles.put_object(obj)

    def get_object(self, handle: int, kind: type | tuple, what: str) -> Any:
        return self.handles.get_object(handle, kind, what)

    def alloc(self, nbytes: int) -> int:
        """A zeroed host buffer of ``nbytes`` (charged before it exists; released when it dies)."""
        if nbytes < 0:
            raise RPCUserError(f"cannot allocate {nbytes} bytes")
        self.account.charge(nbytes, "device memory")
        try:
            buf = self.native.zeros(nbytes)  # shared with the native worker once there is one
            handle = self.handles.put_buffer(buf)
        except BaseException:
            self.account.release(nbytes)
            raise
        weakref.finalize(buf, self.account.release, nbytes)
        return handle

    def free(self, handle: int) -> None:
        self.native.release(self.handles.free_buffer(handle))

    def tensor_view(self, t: TensorHeader) -> np.ndarray:
        """A numpy view of the remote tensor ``t`` (bounds- and device-checked)."""
        if t.device.device_type not in HOST_DEVICE_TYPES:
            raise RPCUserError(f"device {t.device} is not available on this board (cpu and ext_dev only)")
        buf = self.handles.buffers.get(t.data)
        if buf is None:
            buf = self.handles.get_buffer(t.data, "tensor argument")  # (it raises: not this session's)
        dtype = _DTYPES.get(t.dtype)
        if dtype is None:
            try:
                dtype = _DTYPES[t.dtype] = t.dtype.numpy()
            except ValueError as exc:
                raise RPCUserError(str(exc)) from None
        nbytes = int(np.prod(t.shape, dtype=np.int64)) * dtype.itemsize
        if t.byte_offset + nbytes > buf.nbytes:
            raise RPCUserError(f"tensor of {nbytes} bytes at offset {t.byte_offset} exceeds its "
                               f"{buf.nbytes}-byte buffer")
        return buf[t.byte_offset:t.byte_offset + nbytes].view(dtype).reshape(t.shape)

    def _dtype_for_client(self, dtype: np.dtype) -> DataType:
        return DataType.from_numpy(dtype, ffi=self.conn.wire_dialect is Dialect.FFI)

    def export_array(self, arr: np.ndarray) -> RemoteTensor:
        """Hand an array to the client as an NDArray (its memory gets a data handle).  Its bytes are
        charged to the session until the array dies (refused, and dropped, when over budget)."""
        arr = np.asarray(arr, order="C")
        raw = arr.reshape(-1).view(np.uint8) if arr.size else np.zeros(0, np.uint8)
        self.account.charge_object(raw, raw.nbytes, "returned array")
        data = self.handles.put_buffer(raw)
        try:
            ref = self.handles.put_object(NDArrayRef(arr, data, raw))
        except BaseException:
            self.handles.free_buffer(data)
            raise
        header = TensorHeader(data, Device(1, 0), self._dtype_for_client(arr.dtype), tuple(arr.shape), 0)
        return RemoteTensor(header, ref)

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
        if v is None or isinstance(v, (bool, int, float, str, Device, DataType, FunctionHandle)):
            return v  # (a FunctionHandle: one the session already handed out, reissued)
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
    async def handle(self, event) -> Answer:
        """The answer to one request event (a value or an error; the server encodes it)."""
        try:
            if type(event) is CallFunc and self.initialized:  # the common case first
                func, args = self._prepare(event)
                if func.blocking or func.run is not None:
                    return Returned(await self._call_blocking(func, args), True)
                result = self._run_charged(func.fn, args)
                return Returned(result if type(result) in _PLAIN else self.to_wire(result), True)
            if isinstance(event, InitServer):
                return self._init(event)
            if not self.initialized:
                raise RPCUserError("the client must send kInitServer before any other request")
            if isinstance(event, CallFuncEnd):
                stream, self._stream = self._stream, None
                if stream is None:
                    raise RPCUserError("no streamed call in progress")
                await stream.finish()
                return Returned(None, call=True)
            if isinstance(event, Syscall):
                return Returned(self._syscall(event))
            if isinstance(event, CopyToRemote):
                self._copy_to(event)
                return Returned(None)
            if isinstance(event, CopyFromRemote):
                return CopyData(self._copy_from(event))
            if isinstance(event, BadPacket):
                raise RPCUserError(f"bad packet (RPC code {event.code}): {event.error}")
            raise RPCUserError(f"unexpected request {type(event).__name__}")
        except Exception as exc:  # every failure is an answer, never a dead session (but a call cut by the
            self.errors += 1  # board's call timeout: its session ends after this answer)
            if isinstance(exc, CallTimeout):
                self.ending = "call-timeout"
            if not isinstance(exc, (RPCUserError, ValueError, TypeError, KeyError, IndexError,
                                    FileNotFoundError, PermissionError, RuntimeError)):
                log.exception("internal error serving %s", self.peer)
            return Failed(message(exc))

    def _init(self, ev: InitServer) -> Answer:
        if self.initialized:
            raise RPCUserError("the session is already initialized")
        if ev.version != PROTOCOL_VERSION:
            raise RPCUserError(f"client protocol version mismatch: server speaks {PROTOCOL_VERSION}, "
                               f"client speaks {ev.version}")
        if ev.args and ev.args[0] not in ("rpc.LocalSession",):
            raise RPCUserError(f"session constructor {ev.args[0]!r} is not available on this board")
        self.initialized = True
        return INIT_DONE

    def _charge_storage(self, owner: object, nbytes: int, what: str) -> None:
        """The executor allocation hook: storage is charged before it exists, released when it dies."""
        self.account.charge_object(owner, nbytes, what)

    def bind_allocations(self) -> None:
        """Charge what the executor allocates from the calling task (the one serving this session) to this
        session, from now on: set once for the task, where ``_run_charged`` would set it around every call
        (a quarter of a small call's session time).  Threads the task starts run in a copy of its context."""
        ALLOCATION_HOOK.set(self._hook)

    def _run_charged(self, fn: Callable[..., Any], args: list) -> Any:
        if ALLOCATION_HOOK.get(None) is self._hook:  # (bound by the serving task: bind_allocations)
            return fn(*args)
        token = ALLOCATION_HOOK.set(self._hook)
        try:
            return fn(*args)
        finally:
            ALLOCATION_HOOK.reset(token)

    async def _call_blocking(self, func: PackedFunction, args: list) -> Any:
        """A module function (inference, loading): in a worker thread, under the server's limiter,
        so the event loop keeps serving the other sessions; native code with a runner from the loop
        itself, no thread hop (``rpcsrv.native.fastpath``), where the call allows it."""
        if func.run is not None:
            done, result = await func.run(*args)
            if done:
                backend = func.backend
                # (no loan under a call timeout: the worker would answer calls the server cannot time)
                if (self.baton is None or self.baton.backend is not backend) and self.native.call_timeout is None:
                    from .baton import Baton  # native code called: repeated calls may be lent

                    self.baton = Baton(self, backend)
                return result if type(result) in _PLAIN else self.to_wire(result)
        result = await trio.to_thread.run_sync(self._run_charged, func.fn, args, limiter=self.limiter)
        return result if type(result) in _PLAIN else self.to_wire(result)

    def _prepare(self, ev: CallFunc) -> tuple[PackedFunction, list]:
        """The function a call names (in this session's table only) and its arguments as values."""
        func = self.handles.objects.get(ev.handle)
        if type(func) is not PackedFunction:  # (the exact type is the common case: one check)
            func = self.get_object(ev.handle, PackedFunction, "function")
        return func, [v if type(v) in _PLAIN else self.to_local(v) for v in ev.args]

    # ------------------------------------------------------------------ streamed calls (uploads)
    def open_stream(self, ev: CallFuncStart) -> bool:
        """Whether ``ev``'s trailing bytes should stream (its function takes them piece by piece)."""
        fn = self.objects.get(ev.handle)
        if not self.initialized or not isinstance(fn, PackedFunction) or fn.stream is None:
            return False
        self._abort_stream()
        try:
            self._stream = StreamedCall(fn.stream(*[self.to_local(a) for a in ev.args], ev.nbytes),
                                        limiter=self.limiter)
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

    def close(self) -> None:
        """Drop everything the session holds (buffers, modules, workspace) and its memory account."""
        if self.closed:
            return
        self.closed = True
        self._abort_stream()
        self.globals.clear()
        self.handles.clear()
        self.native.close()
        self.workspace.cleanup()
        self.account.close()


#: values that cross as they are, both ways (arguments to functions, results to the client)
_PLAIN = frozenset({type(None), bool, int, float, str})
#: the numpy dtype of each DataType a tensor argument named (looked up per argument)
_DTYPES: dict = {}


