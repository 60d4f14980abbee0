"""A pure-Python TVM RPC client shaped like ``tvm.rpc`` (no TVM needed).

    sess = rpcsrv.client.rpc.connect("127.0.0.1", 9090)
    sess.upload("model.so")
    lib = sess.load_module("model.so")
    dev = sess.cpu(0)
    x = sess.array(np.ones((1, 3), "float32"), dev)
    y = lib["subgraph_0"](x, out)

It speaks either dialect through the shared sans-IO :mod:`rpcsrv.protocol` (tvm-ffi by default), so
it talks to rpcsrv and to TVM's own servers alike.  Remote objects free their server handles after
they are garbage-collected, as TVM's client does, but never from ``__del__`` itself: a collection
can run in the middle of another request, so ``__del__`` only queues the free, and the queue is sent
before the next request (or on close).  Every answer that is not the one expected, and every broken
packet, raises :class:`RPCError`.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import socket
from typing import Any, Optional

import numpy as np

from rpcsrv.protocol import (BadPacket, Connection, ConnectionClosed, CopyAck, DataType, Device, Dialect,
                             FunctionHandle, HandshakeDone, HandshakeRefused, LocalProtocolError, ModuleHandle,
                             OpaqueHandle,
                             ProtocolError, RemoteError, RemoteTensor, Return, Role, RPCCode, TensorHeader,
                             unpack_return)
from rpcsrv.protocol.kinds import TABLES
from rpcsrv.protocol.dtypes import DLDeviceType


class RPCError(RuntimeError):
    """The server answered with an exception, or the connection failed."""


class RPCSession:
    """One connection to an RPC server."""

    def __init__(self, sock: socket.socket, conn: Connection):
        self._sock = sock
        self._conn = conn
        self._funcs: dict[str, RemoteFunction] = {}
        self.closed = False
        # frees queued by __del__ (deque.append is atomic: safe from a collection in any thread)
        self._frees: collections.deque = collections.deque()
        self._flushing = False

    # ----------------------------------------------------------------- transport
    def _send(self, parts: list, progress=None) -> None:
        if self.closed:
            raise RPCError("the session is closed")
        total = sum(len(p) for p in parts)
        if total <= 1 << 16:
            self._sock.sendall(b"".join(parts))
            return
        sent = 0
        for p in parts:
            view = memoryview(p).cast("B") if len(p) else memoryview(b"")
            for start in range(0, len(view), 1 << 22 if progress else max(len(view), 1)):
                chunk = view[start:start + (1 << 22)] if progress else view
                self._sock.sendall(chunk)
                sent += len(chunk)
                if progress:
                    progress(sent)

    def _recv_event(self):
        """The next event, reading as the connection's shared receive loop asks (``Connection.reads``)."""
        steps = self._conn.reads()
        try:
            want = next(steps)
            while True:
                want = steps.send(self._sock.recv(want) if type(want) is int else self._sock.recv_into(want))
        except StopIteration as done:
            return done.value

    def _request(self, parts, progress=None, expect: type = Return):
        """Send one request (``parts``, or a function building them once queued frees went out)
        and return its answer, which must be an ``expect`` event; anything else is an RPCError."""
        self._flush_frees()
        if callable(parts):
            try:
                parts = parts()
            except LocalProtocolError:  # an earlier request never got its answer (e.g. interrupted)
                self._broken("the connection is out of step after an earlier failure; reconnect")
        self._send(parts, progress)
        try:
            ev = self._recv_event()
        except ProtocolError as exc:
            self._broken(f"bad answer from the server: {exc}")
        if isinstance(ev, expect):
            return ev
        if isinstance(ev, RemoteError):
            raise RPCError(ev.message)
        if isinstance(ev, ConnectionClosed):
            self._broken(f"connection closed by the server: {ev.error or 'clean close'}")
        if isinstance(ev, BadPacket):
            raise RPCError(f"bad answer from the server (RPC code {ev.code}): {ev.error}")
        raise RPCError(f"unexpected answer from the server: {type(ev).__name__} (expected {expect.__name__})")

    def _broken(self, message: str):
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.close()
        raise RPCError(message)

    def _call(self, handle: int, args: list) -> Any:
        ev = self._request(lambda: self._conn.send_call(handle, [self._wire(a) for a in args]))
        try:
            value = unpack_return(ev.values, self._conn.wire_dialect)
        except ProtocolError as exc:
            raise RPCError(f"bad return value from the server: {exc}") from None
        return self._local(value)

    def _syscall(self, code: RPCCode, args: list) -> Any:
        ev = self._request(lambda: self._conn.send_syscall(code, args))
        return ev.values[0] if ev.values else None

    def _free(self, handle: int, kind: type) -> None:
        """Queue freeing server ``handle`` of return kind ``kind`` (called from ``__del__``)."""
        if not self.closed:
            self._frees.append((RPCCode.FREE_HANDLE, handle, kind))

    def _free_data(self, device: Device, data: int) -> None:
        if not self.closed:
            self._frees.append((RPCCode.DEV_FREE_DATA, data, device))

    def _flush_frees(self) -> None:
        """Send the queued frees (each a round trip; errors ignored: the handle is gone either way)."""
        if self._flushing or not self._frees:
            return
        self._flushing = True
        try:
            while self._frees and not self.closed:
                code, handle, extra = self._frees.popleft()
                if code == RPCCode.FREE_HANDLE:
                    args = [OpaqueHandle(handle), TABLES[self._conn.wire_dialect].return_codes[extra]]
                else:
                    args = [extra, OpaqueHandle(handle)]
                with contextlib.suppress(RPCError):
                    self._request(self._conn.send_syscall(code, args))
        finally:
            self._flushing = False

    def _wire(self, v: Any) -> Any:
        if isinstance(v, RemoteArray):
            return v.header
        if isinstance(v, RemoteModule):
            return ModuleHandle(v.handle)
        if isinstance(v, RemoteFunction):
            return FunctionHandle(v.handle)
        if isinstance(v, RemoteDevice):
            return v.device
        if isinstance(v, np.ndarray):
            raise TypeError("pass remote arrays (session.array(x, dev)), not numpy arrays")
        if isinstance(v, np.generic):
            return v.item()
        return v

    def _local(self, v: Any) -> Any:
        if isinstance(v, RemoteTensor):
            return RemoteArray(self, v.header, owner=v.handle)
        if isinstance(v, ModuleHandle):
            return RemoteModule(self, v.value)
        if isinstance(v, FunctionHandle):
            return RemoteFunction(self, v.value)
        return v

    # ----------------------------------------------------------------- API like tvm.rpc
    def get_function(self, name: str) -> "RemoteFunction":
        handle = self._syscall(RPCCode.GET_GLOBAL_FUNC, [name])
        if not handle or not handle.value:
            raise AttributeError(f"the server has no global function {name!r}")
        return RemoteFunction(self, handle.value)

    def _global(self, name: str) -> "RemoteFunction":
        if name not in self._funcs:
            self._funcs[name] = self.get_function(name)
        return self._funcs[name]

    def upload(self, data, target: Optional[str] = None, progress=None) -> None:
        """Upload a file (path) or bytes to the workspace; ``progress(bytes_sent)`` is called as it goes."""
        if isinstance(data, (bytes, bytearray, memoryview)):
            if not target:
                raise ValueError("target must be given when uploading bytes")
            self._upload(target, data, progress)
            return
        target = target or os.path.basename(data)
        with open(data, "rb") as f:  # mapped, not read: the file goes out without a copy in memory
            if os.fstat(f.fileno()).st_size == 0:
                self._upload(target, b"", progress)
                return
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._upload(target, memoryview(mm), progress)
        finally:
            with contextlib.suppress(BufferError):  # a failed send's traceback may still hold a view
                mm.close()

    def _upload(self, target: str, blob, progress) -> None:
        fn = self._global("tvm.rpc.server.upload")
        if progress is None:
            fn(target, blob)
        else:
            self._request(lambda: self._conn.send_call(fn.handle, [target, blob]), progress)

    def download(self, path: str) -> bytes:
        return bytes(self._global("tvm.rpc.server.download")(path))

    def listdir(self, path: str = ".") -> str:
        """The names in a workspace folder joined by ',' (as TVM's client returns them)."""
        return self._global("tvm.rpc.server.listdir")(path)

    def remove(self, path: str) -> None:
        self._global("tvm.rpc.server.remove")(path)

    def load_module(self, path: str) -> "RemoteModule":
        return self._global("tvm.rpc.server.load_module")(path)

    def device(self, device_type: int, device_id: int = 0) -> "RemoteDevice":
        return RemoteDevice(self, Device(int(device_type), device_id))

    def cpu(self, dev_id: int = 0) -> "RemoteDevice":
        return self.device(DLDeviceType.CPU, dev_id)

    def ext_dev(self, dev_id: int = 0) -> "RemoteDevice":
        return self.device(DLDeviceType.EXT_DEV, dev_id)

    def empty(self, shape, dtype="float32", dev: Optional["RemoteDevice"] = None) -> "RemoteArray":
        dev = dev or self.cpu()
        dt = DataType.parse(dtype) if isinstance(dtype, str) else DataType.from_numpy(dtype)
        header = TensorHeader(0, dev.device, dt, tuple(int(d) for d in shape), 0)
        handle = self._syscall(RPCCode.DEV_ALLOC_DATA_WITH_SCOPE, [header, None])
        return RemoteArray(self, TensorHeader(handle.value, dev.device, dt, header.shape, 0))

    def array(self, arr, dev: Optional["RemoteDevice"] = None) -> "RemoteArray":
        """A remote copy of numpy array ``arr`` (``tvm.nd.array``)."""
        arr = np.asarray(arr, order="C")
        out = self.empty(arr.shape, arr.dtype, dev)
        out.copyfrom(arr)
        return out

    def close(self) -> None:
        if not self.closed:
            try:
                self._flush_frees()
                self._send(self._conn.send_shutdown())
            except (OSError, RPCError):
                pass
            self.closed = True
            self._sock.close()

    def __enter__(self) -> "RPCSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteDevice:
    def __init__(self, session: RPCSession, device: Device):
        self.session = session
        self.device = device

    def sync(self) -> None:
        self.session._syscall(RPCCode.DEV_STREAM_SYNC, [self.device, OpaqueHandle(0)])

    def __repr__(self) -> str:
        return f"remote {self.device}"


class RemoteFunction:
    def __init__(self, session: RPCSession, handle: int):
        self.session = session
        self.handle = handle

    def __call__(self, *args):
        return self.session._call(self.handle, list(args))

    def __del__(self):
        self.session._free(self.handle, FunctionHandle)


class RemoteModule:
    def __init__(self, session: RPCSession, handle: int):
        self.session = session
        self.handle = handle

    def get_function(self, name: str, query_imports: bool = False) -> RemoteFunction:
        fn = self.session._global("tvm.rpc.server.ModuleGetFunction")(self, name, query_imports)
        if fn is None:
            raise AttributeError(f"module has no function {name!r}")
        return fn

    def __getitem__(self, name: str) -> RemoteFunction:
        return self.get_function(name)

    def time_evaluator(self, name: str, dev: RemoteDevice, number: int = 10, repeat: int = 1,
                       min_repeat_ms: int = 0):
        """Like TVM's: returns f(*args) -> list of mean seconds per call, one per repeat."""
        feval = self.session._global("runtime.RPCTimeEvaluator")(
            self, name, dev.device.device_type, dev.device.device_id, number, repeat, min_repeat_ms,
            100, 0, 1, 0, "")

        def evaluate(*args):
            return list(np.frombuffer(bytes(feval(*args)), dtype="<f8"))
        return evaluate

    def __del__(self):
        self.session._free(self.handle, ModuleHandle)


class RemoteArray:
    """A tensor in the server's memory."""

    def __init__(self, session: RPCSession, header: TensorHeader, owner: Optional[int] = None):
        self.session = session
        self.header = header
        self._owner = owner  # NDArray handle the server gave; None: we allocated the data

    @property
    def shape(self) -> tuple:
        return self.header.shape

    @property
    def dtype(self) -> str:
        return str(self.header.dtype)

    @property
    def device(self) -> RemoteDevice:
        return RemoteDevice(self.session, self.header.device)

    def copyfrom(self, arr) -> "RemoteArray":
        if isinstance(arr, RemoteArray):
            self.session._syscall(RPCCode.COPY_AMONG_REMOTE, [arr.header, self.header, OpaqueHandle(0)])
            return self
        arr = np.asarray(arr, dtype=self.header.dtype.numpy(), order="C")
        if arr.shape != self.shape:
            raise ValueError(f"array shape {arr.shape} does not match the remote shape {self.shape}")
        data = arr.reshape(-1).view(np.uint8).data
        self.session._request(lambda: self.session._conn.send_copy_to_remote(self.header, data))
        return self

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.header.dtype.numpy())
        flat = out.reshape(-1).view(np.uint8)
        sess, conn = self.session, self.session._conn
        sess._flush_frees()  # before naming the target: a free's answer must not land in it
        if out.nbytes:
            conn.expect_copy_ack(flat.data)
        try:
            ev = sess._request(lambda: conn.send_copy_from_remote(self.header, out.nbytes), expect=CopyAck)
        finally:
            conn.expect_copy_ack(None)
        if len(ev.data) != out.nbytes:
            raise RPCError(f"the server sent {len(ev.data)} bytes for a copy of {out.nbytes}")
        if ev.data.obj is not flat.data.obj:
            flat[:] = np.frombuffer(ev.data, dtype=np.uint8)
        return out

    def __del__(self):
        if self._owner is not None:
            self.session._free(self._owner, RemoteTensor)
        else:
            self.session._free_data(self.header.device, self.header.data)

    def __repr__(self) -> str:
        return f"<RemoteArray shape={self.shape} dtype={self.dtype} on {self.header.device}>"


def connect(host: str, port: int, key: str = "", session_timeout: float = 0,
            dialect: Dialect = Dialect.FFI, timeout: float = 60.0) -> RPCSession:
    """Open a session (``tvm.rpc.connect``)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    conn = Connection(Role.CLIENT, dialect=dialect)
    header_key = key + (f" -timeout={session_timeout}" if session_timeout else "")
    sock.sendall(conn.start(header_key))
    sess = RPCSession(sock, conn)
    try:
        ev = sess._recv_event()
    except ProtocolError as exc:
        ev = ConnectionClosed(clean=False, error=str(exc))
    if isinstance(ev, HandshakeRefused):
        sock.close()
        raise RPCError(f"the server refused key {key!r} (code {ev.code})")
    if not isinstance(ev, HandshakeDone):
        sock.close()
        raise RPCError(f"handshake failed: {getattr(ev, 'error', ev)}")
    sess._request(conn.send_init_server())
    return sess
