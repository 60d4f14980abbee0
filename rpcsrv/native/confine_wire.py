"""The session's reading of its worker's messages: what a worker running hostile native code could send.

Native code in the worker can write anything to the socket the worker shares with the server (its
descriptor is a number it can find).  A pickle is a program: loaded as it is, a forged message would run
``os.system`` in the server, with the server's rights, past every layer of ``confine.py``.  So the
server loads a worker's messages with :class:`WorkerUnpickler`, which builds only the classes an answer
is made of (``wire.py``'s ``Ref``/``Shared``/``Copied``, ``Device``/``DataType``, numpy arrays, dtypes and
scalars) and refuses any other global; and it refuses a length beyond :func:`message_limit` before
allocating for it.  Either refusal is a protocol violation: the session kills the worker, as after a
crash (``proxy.py``).  Arrays that cross by handle are bounds-checked against their arena
(``shm.Arena.view``), and object arrays cannot be made over shared memory.
"""

from __future__ import annotations

import io
import pickle
import socket
import sys
from typing import Any

#: (module, name) of every global a worker's answer may name
ALLOWED = frozenset({
    ("rpcsrv.native.wire", "Ref"), ("rpcsrv.native.wire", "Shared"), ("rpcsrv.native.wire", "Copied"),
    ("rpcsrv.protocol.dtypes", "Device"), ("rpcsrv.protocol.dtypes", "DataType"),
    ("rpcsrv.protocol.dtypes", "DLDataTypeCode"), ("rpcsrv.protocol.dtypes", "DLDeviceType"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
})
#: the largest message a worker may send without a session budget to size it by
DEFAULT_LIMIT = (4 << 30) if sys.maxsize > 2 ** 32 else (512 << 20)


class ProtocolViolation(Exception):
    """The worker sent something no rpcsrv worker sends (a forged or oversized message)."""


class WorkerUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise ProtocolViolation(f"the native worker sent a {module}.{name} object")
        return super().find_class(module, name)


def loads(data: bytes | bytearray) -> Any:
    try:
        return WorkerUnpickler(io.BytesIO(data)).load()
    except ProtocolViolation:
        raise
    except Exception as exc:  # a truncated or malformed pickle: the same violation
        raise ProtocolViolation(f"the native worker sent a malformed message: {type(exc).__name__}: {exc}") from None


def message_limit(account: Any) -> int:
    """Bytes one message may hold: the session's memory limit (its largest answer is an array it could
    hold), plus room for the message around it."""
    if account is None:
        return DEFAULT_LIMIT
    try:
        limits = [limit for _name, _used, limit in account.room()]
    except Exception:
        return DEFAULT_LIMIT
    return (min(limits) if limits else DEFAULT_LIMIT) + (1 << 20)


def recv(sock: socket.socket, limit: int) -> Any:
    """One message from a worker (``wire.send``'s framing), checked as above."""
    from .wire import recv_exact

    n = int.from_bytes(recv_exact(sock, 8), "little")
    if n > limit:
        raise ProtocolViolation(f"the native worker announced a {n}-byte message (limit {limit})")
    data = recv_exact(sock, n)
    if data[:1] == b"R":  # a binary result frame (wire.py): checked field by field as it is decoded
        from .wire import FrameError, decode_result

        try:
            return decode_result(bytes(data))
        except FrameError as exc:
            raise ProtocolViolation(f"the native worker sent a malformed result frame: {exc}") from None
    return loads(data)
