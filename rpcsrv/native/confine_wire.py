"""The session's reading of its worker's messages: what a worker running hostile native code could send.

Native code in the worker can write anything to the socket the worker shares with the server (its descriptor is
a number it can find). A pickle is a program: loaded as it is, a forged message would run ``os.system`` in the
server, with the server's rights, past every layer of ``confine.py``. So the server loads a worker's messages
with :class:`WorkerUnpickler`, which builds only the classes an answer is made of (``wire.py``'s
``Ref``/``Shared``/``Copied``, ``Device``/``DataType``, numpy arrays, dtypes and scalars) and refuses any other
global; and it refuses a length beyond ``wire.message_limit`` before allocating for it (``wire.recv_checked``:
the framing, and binary frames checked field by field). Either refusal is a protocol violation: the session
kills the worker, as after a crash (``proxy.py``). Arrays that cross by handle are bounds-checked against their
arena (``shm.Arena.view``), and object arrays cannot be made over shared memory.
"""

from __future__ import annotations

import io
import pickle
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
