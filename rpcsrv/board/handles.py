"""A session's handle table: the only names a client can use for what the server holds.

Handles are capabilities: random-looking 64-bit values valid in one session only; an unknown or
foreign handle is an error answer, never a crash.  Two kinds share one numbering:

* data handles name raw host buffers (``DevAllocData``; the memory of NDArrays the server returns);
* object handles name functions, modules and NDArrays handed to the client.

The table is bounded (``max_handles``) and each entry is charged to the session's memory account
(:data:`rpcsrv.board.accounts.HANDLE_COST`), so a client cannot grow it without limit.  A global function
asked for twice gets the same handle, counted: it stays valid until freed as many times.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .accounts import HANDLE_COST, MemoryAccount, RPCUserError


@dataclass
class NDArrayRef:
    """An NDArray the server handed out: its array and the data handle that names its memory.

    ``memory`` is the object its bytes are charged to (``Session.export_array``): the object handle and
    the data handle each keep it, so freeing one of the two does not end the charge while the other
    still holds the array."""

    array: np.ndarray
    data_handle: int
    memory: Any = None


@dataclass
class PackedFunction:
    """A function handed out to the client; ``blocking`` ones run in a worker thread.

    ``stream``: for a function whose last argument is bytes and which returns nothing (an upload), a
    factory ``stream(*other_args, nbytes)`` of a sink (``write(piece)``, ``commit()``, ``abort()``)
    that takes those bytes piece by piece as they arrive, so a large call never sits in memory whole.
    ``run``: for native code, an async runner the session awaits instead of a worker thread
    (``rpcsrv.native.fastpath``), answering ``(done, value)``; not done, the call takes the thread.
    ``backend``: the backend the function belongs to, for a module's function (``rpcsrv.native.backend``).
    """

    fn: Callable[..., Any]
    name: str
    blocking: bool = True
    stream: Optional[Callable[..., Any]] = None
    run: Optional[Callable[..., Any]] = None
    backend: Any = None


class HandleTable:
    def __init__(self, account: MemoryAccount, max_handles: int = 1 << 16):
        self.account = account
        self.max_handles = max_handles
        self.buffers: dict[int, np.ndarray] = {}
        self.objects: dict[int, Any] = {}
        self.refs: dict[int, int] = {}  # handle -> times handed out, when more than once
        self._next = 0x7E0000000000 + (secrets.randbits(24) << 12)

    def __len__(self) -> int:
        return len(self.buffers) + len(self.objects)

    def _new(self, what: str) -> int:
        if len(self) >= self.max_handles:
            raise RPCUserError(f"{what}: this session already holds {len(self)} handles, the limit "
                               f"(free some first)")
        self.account.charge(HANDLE_COST, what)
        self._next += 0x40
        return self._next

    def put_object(self, obj: Any, what: str = "new handle") -> int:
        h = self._new(what)
        self.objects[h] = obj
        return h

    def put_buffer(self, buf: np.ndarray, what: str = "new data handle") -> int:
        h = self._new(what)
        self.buffers[h] = buf
        return h

    def get_object(self, handle: int, kind: type | tuple, what: str) -> Any:
        obj = self.objects.get(handle)
        if obj is None or not isinstance(obj, kind):
            raise RPCUserError(f"unknown {what} handle 0x{handle:x} (not issued by this session, or freed)")
        return obj

    def get_buffer(self, handle: int, what: str) -> np.ndarray:
        buf = self.buffers.get(handle)
        if buf is None:
            raise RPCUserError(f"unknown data handle 0x{handle:x} in {what}")
        return buf

    def share(self, handle: int) -> None:
        """``handle`` was handed out once more (a global asked for again)."""
        self.refs[handle] = self.refs.get(handle, 1) + 1

    def free_object(self, handle: int) -> Any:
        """Drop one reference to object ``handle``; returns the object when it was the last (else None)."""
        if handle not in self.objects:
            raise RPCUserError(f"cannot free unknown handle 0x{handle:x}")
        if self.refs.get(handle, 1) > 1:
            self.refs[handle] -= 1
            return None
        self.refs.pop(handle, None)
        self.account.release(HANDLE_COST)
        return self.objects.pop(handle)

    def reissue(self, handle: int, obj: Any, what: str = "function handle") -> None:
        """Hand out ``handle`` for ``obj`` again: counted when it is held, else back in the table (a
        freed handle is never given to anything else: the numbering only grows)."""
        if handle in self.objects:
            self.share(handle)
            return
        if len(self) >= self.max_handles:
            raise RPCUserError(f"{what}: this session already holds {len(self)} handles, the limit "
                               f"(free some first)")
        self.account.charge(HANDLE_COST, what)
        self.objects[handle] = obj

    def set_count(self, handle: int, obj: Any, count: int) -> None:
        """Make ``handle`` (naming ``obj``) handed out ``count`` times (0: freed): what a native worker's
        repeated lookups and frees left (``rpcsrv.board.baton``)."""
        if count <= 0:
            if handle in self.objects:
                self.refs.pop(handle, None)
                self.objects.pop(handle)
                self.account.release(HANDLE_COST)
            return
        if handle not in self.objects:
            self.reissue(handle, obj)
        if count > 1:
            self.refs[handle] = count
        else:
            self.refs.pop(handle, None)

    def free_buffer(self, handle: int) -> np.ndarray:
        buf = self.buffers.pop(handle, None)
        if buf is None:
            raise RPCUserError(f"unknown data handle 0x{handle:x} (not allocated by this session, or freed)")
        self.account.release(HANDLE_COST)
        return buf

    def clear(self) -> None:
        self.account.release(HANDLE_COST * len(self))
        self.buffers.clear()
        self.objects.clear()
        self.refs.clear()
