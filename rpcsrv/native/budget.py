"""A native worker's side of its session's memory budget.

What a worker allocates for its session (executor storage in its arena, ...) happens in another
process, where the session's :class:`rpcsrv.board.accounts.MemoryAccount` cannot see it.  So every request
carries the session's budget (``wire.py``): what the session has charged for this worker so far, and
``(name, used, limit)`` of the session's account and each parent (``MemoryAccount.room``).  In the
worker, :meth:`WorkerBudget.charge` is the executors' allocation hook
(``rpcsrv.executor.memory.ALLOCATION_HOOK``, called *before* they allocate): it refuses an allocation
that would take any of those accounts past its limit, counting what the worker has grown since the
session last charged it, and raises :class:`OverBudget`, which goes back as a ``("budget", ...)``
answer that the session turns into its account's own ``BudgetError`` (same wording).  Every answer
says how much the worker holds (``held``); the session charges or releases the difference.

Held bytes are released when the object they were charged for dies (``weakref.finalize``), as in
the server process.  The session's account cannot change under a request except through other
sessions' charges on the server-wide account: those race with the worker's check, and the session
then counts what the worker really holds even past the limit (``MemoryAccount.add_held``), so that
its next requests are refused until memory is released.
"""

from __future__ import annotations

import threading
import weakref
from typing import Optional

#: a request's budget: (bytes the session has charged for the worker, ((name, used, limit), ...)),
#: or None (no budget: a worker used without a session, e.g. in tests and benchmarks)
Budget = Optional[tuple[int, tuple[tuple[str, int, int], ...]]]


class OverBudget(Exception):
    """An allocation refused in the worker: ``args`` are ``(what, nbytes, name, used, limit)``."""


def refusal_in(exc: Optional[BaseException]) -> Optional[OverBudget]:
    """The OverBudget that caused ``exc`` (itself, or one an executor wrapped in its own error)."""
    for _ in range(16):  # a bounded walk down the cause/context chain
        if exc is None or isinstance(exc, OverBudget):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class WorkerBudget:
    def __init__(self) -> None:
        self.held = 0  # bytes charged for objects alive in this worker
        self._charged = 0  # of which the session has counted (with the current request's budget)
        self._accounts: tuple[tuple[str, int, int], ...] = ()
        self._lock = threading.Lock()  # finalizers may run in any thread

    def grant(self, budget: Budget) -> None:
        """The budget sent with the request about to be served."""
        if budget is None:
            self._charged, self._accounts = self.held, ()
        else:
            self._charged, self._accounts = budget

    def charge(self, owner: object, nbytes: int, what: str) -> None:
        """The allocation hook: count ``nbytes`` for ``owner`` until it dies, or raise OverBudget."""
        if nbytes < 0:
            raise ValueError(f"{what}: negative size {nbytes}")
        with self._lock:
            self._check_locked(nbytes, what)
            self.held += nbytes
        weakref.finalize(owner, self._release, nbytes)

    def check(self, nbytes: int, what: str) -> None:
        """Raise OverBudget unless ``nbytes`` more would fit now (for a copy that the session charges
        itself once it arrives: a returned array)."""
        with self._lock:
            self._check_locked(nbytes, what)

    def _check_locked(self, nbytes: int, what: str) -> None:
        grown = self.held - self._charged  # what the session has not counted yet
        for name, used, limit in self._accounts:
            if used + grown + nbytes > limit:
                raise OverBudget(what, nbytes, name, used + grown, limit)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes
