"""What the executor allocates during a call is charged to the session that called it (``ALLOCATION_HOOK``):
bound once for the task that serves the session (``Session.bind_allocations``), set around the call elsewhere
(a thread of another context, a test calling ``handle`` itself), never left behind, never another session's."""

from __future__ import annotations

import trio

from rpcsrv.board.globals import REGISTRY
from rpcsrv.board.session import Session
from rpcsrv.board.workspace import Workspace
from rpcsrv.executor.memory import ALLOCATION_HOOK
from rpcsrv.protocol import Connection, Role


def _hook():
    """The allocation hook in force where it is called."""
    return ALLOCATION_HOOK.get(None)


def _session() -> Session:
    return Session(Connection(Role.SERVER), Workspace.create(None), REGISTRY)


async def test_each_session_charges_its_own_calls_bound_or_not():
    a, b = _session(), _session()
    seen = {}

    async def serve(name: str, session: Session, bind: bool):
        if bind:
            session.bind_allocations()
        seen[name] = session._run_charged(_hook, [])
        await trio.sleep(0.01)  # the other task runs meanwhile
        seen[name + " again"] = session._run_charged(_hook, [])
        seen[name + " thread"] = await trio.to_thread.run_sync(session._run_charged, _hook, [])
        seen[name + " after"] = ALLOCATION_HOOK.get(None)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, "a", a, True)
            nursery.start_soon(serve, "b", b, False)
    finally:
        a.close()
        b.close()
    for name, session in (("a", a), ("b", b)):
        for when in ("", " again", " thread"):
            assert seen[name + when] == session._charge_storage, name + when
    assert seen["a after"] == a._charge_storage  # bound for a's task
    assert seen["b after"] is None  # set around each call only
    assert ALLOCATION_HOOK.get(None) is None  # the test's own task: untouched
