"""Memory accounts: every byte a client can make the server hold is charged before it is allocated.

One :class:`MemoryAccount` per session, each a child of one server-wide account; a charge must fit
both, or it is refused with :class:`BudgetError` (an answer to the client, nothing allocated).  What
is charged, and where (tests in ``tests/server/test_budgets.py`` name each path):

* device arrays (``DevAllocData``): ``Session.alloc``;
* arrays returned to the client (NDArray handles): ``Session.export_array``;
* executor storage sized from a client's graph JSON, and Relax VM storage: the allocation hook of
  :mod:`rpcsrv.executor.memory`, which the session sets around its worker-thread calls;
* workspace files (uploads, written files): :class:`rpcsrv.board.workspace.Workspace`;
* handle table entries: a fixed cost per entry (:data:`HANDLE_COST`) in :class:`rpcsrv.board.handles.HandleTable`;
* native workers (``--native isolated``): a fixed cost per worker process, and what the worker holds
  for the session (its executors' storage, ...), checked in the worker against the room the session
  sends with each request and charged here after it (:mod:`rpcsrv.native.budget`).

Tests of the native worker's share: ``tests/native/test_worker_budget.py``.

Charges that belong to a numpy buffer are released when the buffer itself dies (``weakref.finalize``),
not when its handle is freed: a buffer freed by the client but still bound into an executor (e.g. by
``set_input_zero_copy``) stays charged for as long as it lives.  Release callbacks may run in any
thread, so the counters are guarded by a lock.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Optional

#: bytes charged for one handle table entry (the entry, its dict slot, the wrapper object)
HANDLE_COST = 512
#: the server-wide budget's default share of physical memory: the rest stays for the system, the
#: server's own code and libraries, and the page cache
TOTAL_MEMORY_SHARE = 0.5


class RPCUserError(RuntimeError):
    """An error answered to the client as an RPC exception (bad handle, bad argument, ...)."""


class BudgetError(RPCUserError):
    """A request that would take a session or the server past its memory budget."""


def physical_memory() -> int:
    """Bytes of physical memory (0 when the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_total_memory() -> int:
    """The default server-wide budget: :data:`TOTAL_MEMORY_SHARE` of physical memory (8 GiB if unknown)."""
    phys = physical_memory()
    return int(phys * TOTAL_MEMORY_SHARE) if phys else 8 << 30


def over_budget(what: str, nbytes: int, name: str, used: int, limit: int) -> str:
    """The refusal message of every budget check (the session's, the server's, a native worker's)."""
    return (f"{what} needs {nbytes} bytes, beyond the {name} memory budget "
            f"({used} of {limit} bytes in use)")


class MemoryAccount:
    """A byte budget; ``parent`` (the server's account) must also have room for every charge."""

    def __init__(self, limit: int, parent: Optional["MemoryAccount"] = None, name: str = "session"):
        self.limit = limit
        self.parent = parent
        self.name = name
        self.used = 0
        self.closed = False
        self._lock = threading.Lock() if parent is None else parent._lock  # one lock per tree

    def charge(self, nbytes: int, what: str) -> None:
        """Take ``nbytes`` from this account and its parents, or raise BudgetError taking nothing."""
        if nbytes < 0:
            raise BudgetError(f"{what}: negative size {nbytes}")
        with self._lock:
            if self.closed:
                raise BudgetError(f"{what}: the session is closed")
            acct = self
            while acct is not None:
                if acct.used + nbytes > acct.limit:
                    raise BudgetError(over_budget(what, nbytes, acct.name, acct.used, acct.limit))
                acct = acct.parent
            acct = self
            while acct is not None:
                acct.used += nbytes
                acct = acct.parent

    def add_held(self, nbytes: int) -> None:
        """Count ``nbytes`` that already exist (a native worker's growth, reported after its request):
        counted even past the limit, which then refuses the next charges until some is released."""
        with self._lock:
            if self.closed:
                return
            acct = self
            while acct is not None:
                acct.used += nbytes
                acct = acct.parent

    def room(self) -> tuple[tuple[str, int, int], ...]:
        """``(name, used, limit)`` of this account and each parent: what a native worker checks its
        allocations against (:mod:`rpcsrv.native.budget`)."""
        with self._lock:
            chain, acct = [], self
            while acct is not None:
                chain.append((acct.name, acct.used, acct.limit))
                acct = acct.parent
            return tuple(chain)

    def refusal(self, what: str, nbytes: int, name: str, used: int, limit: int) -> BudgetError:
        """The error for an allocation refused elsewhere against this account's :meth:`room` (a
        native worker's), worded as this account's own refusals."""
        return BudgetError(over_budget(what, nbytes, name, used, limit))

    def release(self, nbytes: int) -> None:
        with self._lock:
            if self.closed:  # close() already handed everything back
                return
            acct = self
            while acct is not None:
                acct.used -= nbytes
                acct = acct.parent

    def charge_object(self, obj: Any, nbytes: int, what: str) -> None:
        """Charge ``nbytes`` for ``obj`` and release them when ``obj`` is garbage-collected."""
        self.charge(nbytes, what)
        weakref.finalize(obj, self.release, nbytes)

    def close(self) -> None:
        """Hand back to the parent whatever this account still holds (the session ended; objects
        still alive elsewhere then stop counting against it)."""
        with self._lock:
            held, self.used = self.used, 0
            acct = self.parent
            while acct is not None:
                acct.used -= held
                acct = acct.parent
            self.limit, self.closed = 0, True
