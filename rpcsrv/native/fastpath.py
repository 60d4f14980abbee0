"""Native kernel calls from the server's event loop, without a thread hop.

A session runs a blocking function in a worker thread (``trio.to_thread``): two thread wake-ups per
call, which on a busy board cost more than a small kernel itself (``add_one`` on 16 floats took 225 us in
process and 732 us through the isolated worker that way, against 42 us on TVM's own server).  A client that
calls a kernel over and over (a tuner, a script) pays that on every call.  So each backend gives the native
functions it hands out a *runner* (``Backend.runner``), which the session awaits instead of the thread:

* a function of the session's native worker (``remote.WorkerFunction``): the request goes into the
  worker's socket as one binary frame and the loop waits for the answer as for any socket
  (``proxy.Worker.call_async``), so the loop serves other sessions while the kernel runs and no thread of
  the server wakes up.  What cannot go this way (copied arrays, objects to free first) takes the thread;
* a native function in the server process (``--native inprocess``): run right on the loop while it
  has proven short (:class:`Inline`): its first call runs in a thread and is timed (the CPU time of
  the calling thread); calls that took less than :data:`INLINE_LIMIT` run inline from then on, timed
  too; after :data:`STRIKES` calls over the limit it goes back to the thread for good.  So the loop
  is held past ``INLINE_LIMIT`` of CPU time at most ``STRIKES`` times by any one function, ever.

A runner returns ``(done, value)``; ``done`` False sends the call down the usual thread path.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable, Optional

#: a native call at most this long (seconds) may run on the event loop (``--native inprocess``)
INLINE_LIMIT = 0.0005
#: calls over the limit after which a function never runs inline again
STRIKES = 3


class Inline:
    """A native function of the server process, run on the event loop while it is short.  What was
    learned of a function (timed yet, strikes) stays with the function: a client that looks it up
    before every call gets a new runner each time, and the same verdict.  ``called(fn, args)`` hears of
    every call made (the backend keeps the last one for a loan)."""

    def __init__(self, fn: Any, limiter: Any = None, called: Optional[Callable[[Any, tuple], None]] = None):
        self.fn, self.limiter, self.called = fn, limiter, called
        self.seen = _SEEN.setdefault(fn, [False, 0])  # [timed yet, calls over the limit]

    def _timed(self, args: tuple) -> Any:
        start = time.thread_time()  # this thread's CPU time: a call preempted on a busy board is no strike
        try:
            return self.fn(*args)
        finally:
            if time.thread_time() - start > INLINE_LIMIT:
                self.seen[1] += 1
            self.seen[0] = True

    async def __call__(self, *args: Any) -> tuple[bool, Any]:
        known, strikes = self.seen
        if strikes >= STRIKES:
            return False, None  # the usual path (a thread)
        if known:
            value = self._timed(args)
        else:
            import trio

            value = await trio.to_thread.run_sync(self._timed, args, limiter=self.limiter)
        if self.called is not None:
            self.called(self.fn, args)
        return True, value


#: what was learned of each function (``Inline``), for as long as the function lives
_SEEN: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()
