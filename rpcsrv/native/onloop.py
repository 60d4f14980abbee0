"""A native worker's function called from the session's trio loop: no thread hop (issue 26).

A remote call of a worker function is a blocking call for the session (``handles.PackedFunction``):
made in a thread of the server (``trio.to_thread``), it costs two thread switches on top of the
worker's round trip, the largest part of a small kernel call (``bench/native_bench.py --breakdown``).
But the session only *waits* there: the work happens in the worker.  So when the call's arrays all
live in the shared arenas (only handles cross), :func:`call` sends the request from the loop and waits
for the worker's answer with ``trio.lowlevel.wait_readable``, which blocks nothing else.  A first
message that asks for a compute slot (a model run in the worker) goes on in a thread, where waiting
for the slot may block; so does a call with copied arrays (charged while they travel, maybe large),
one with freed objects to report first, or one that finds the worker busy.  Deadlines, crashes and
forged messages end the worker as on the thread path (``proxy.Worker.request``); a cancelled wait
(the client went away) ends it too, since its answer would otherwise arrive in the next request's place.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from .confine_wire import ProtocolViolation
from .library import NativeError
from .worker import _send


async def call(worker: Any, req_head: tuple, args: tuple, what: str, limiter: Any = None) -> Any:
    """``worker.call(req_head, args, what)``, waiting on the loop when it can (see the module doc); the
    thread path takes its thread under ``limiter`` (the server's)."""
    copied: list = []
    wire_args = [worker.to_wire(a, copied) for a in args]
    if copied or any(isinstance(w, bytes) for w in wire_args) or worker._garbage \
            or not worker.lock.acquire(blocking=False):
        return await trio.to_thread.run_sync(worker.call, req_head, args, what, limiter=limiter)
    try:
        if worker.dead is not None:
            raise NativeError(f"{what}: the native worker of this session is gone ({worker.dead}); "
                              f"load the module again")
        try:
            _send(worker.sock, (worker._budget(), req_head + (wire_args,)))
            first = await _first_message(worker, what)
            if first[0] in ("slot", "slot-done"):
                answer = await trio.to_thread.run_sync(worker._answer, what, first, limiter=limiter)
            else:
                answer = first
            answer = worker._settle(answer)
        except (ProtocolViolation, EOFError, OSError, ConnectionError) as exc:
            raise worker._failure(exc, what) from None
    finally:
        worker.lock.release()
    result, _outs = worker._result(answer, what)
    return worker.from_wire(result)


async def _first_message(worker: Any, what: str) -> tuple:
    deadline = worker.deadline()
    try:
        with trio.move_on_after(float("inf") if deadline is None else max(0.0, deadline - time.monotonic())):
            await trio.lowlevel.wait_readable(worker.sock)
            return worker._recv()
    except trio.Cancelled:
        worker.kill("the call was cancelled")  # its answer would come in the next request's place
        raise
    worker.kill("stopped at the session deadline")
    raise NativeError(f"{what}: native code was still running at the session deadline; its worker was stopped")
