"""The board's health: a self-test repeated while the board is idle, its verdict, and who acts on it.

A board farm (LAVA, labgrid) runs a health check on each board and takes a failing board out of
scheduling until it passes again.  ``rpcsrv serve --health-interval S`` does that for a TVM farm:

* every ``S`` seconds, once no session is open (a board a client holds is in use; the test waits for the
  board to be free), :func:`run_health` runs the self-test in a thread of its own, off the event loop,
  bounded by :data:`TEST_TIMEOUT`;
* :class:`Health` (``Server.health``) keeps the verdict: ``/healthz`` answers 503 with the reason while it
  fails, the metrics show the state, the checks and the last failure (``observe/collector.py``), and the
  log says when the board fails (and why) and when it passes again;
* whoever offers the board to clients watches it (:meth:`Health.watch`): the tracker registration leaves
  the tracker while the test fails and registers again when it passes (``rpcsrv.farm.registration``); a
  board behind a proxy stops waiting there likewise (``rpcsrv.farm.proxy_client``).

The test itself is handed in: a callable returning the problems it found ([] when the board is healthy).
The board does not import the tools above it; ``rpcsrv serve`` passes ``rpcsrv check``'s smoke runs
(``rpcsrv.check.self_test``: an ExampleJSON graph in this process, the check kernel called in a native
worker as the serve flags run native code).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import trio

log = logging.getLogger("rpcsrv.health")

#: seconds one self-test may take before it counts as failed (its thread is abandoned)
TEST_TIMEOUT = 120.0
#: how often a due test looks again whether the board is free
IDLE_POLL = 0.2


class Health:
    """The self-test's verdict and its history (read on the trio loop: metrics, /healthz, the farm)."""

    def __init__(self) -> None:
        self.ok = True  # passing, or never tested
        self.reason = ""  # while failing: the problems the last test found
        self.checks = {"ok": 0, "failed": 0}
        self.last_check = 0.0  # Unix time of the last test's end (0: none yet)
        self.last_failure = 0.0  # Unix time of the last failed test (0: none)
        self.last_failure_reason = ""
        self._watchers: list[Callable[[bool, str], None]] = []

    def watch(self, fn: Callable[[bool, str], None]) -> None:
        """Call ``fn(ok, reason)`` on the trio loop each time the verdict changes."""
        self._watchers.append(fn)

    def record(self, problems: list[str]) -> None:
        """One test's result: the verdict, the counts, the log, and the watchers when the verdict changed."""
        now = time.time()
        self.last_check = now
        was = self.ok
        if problems:
            self.checks["failed"] += 1
            self.reason = "; ".join(problems)
            self.last_failure, self.last_failure_reason = now, self.reason
            self.ok = False
            if was:
                log.warning("self-test failed: %s; the board stops taking clients until it passes", self.reason)
        else:
            self.checks["ok"] += 1
            self.ok, self.reason = True, ""
            if not was:
                log.warning("self-test passes again; the board takes clients again")
        if was != self.ok:
            for fn in self._watchers:
                fn(self.ok, self.reason)


def _run(test: Callable[[], list[str]]) -> list[str]:
    try:
        return list(test())
    except Exception as exc:  # a test that breaks is a failed test, never a dead board
        return [f"the self-test raised {type(exc).__name__}: {exc}"]


async def run_health(server: Any, test: Callable[[], list[str]], task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run ``test`` every ``server.options.health_interval`` seconds while the board is free, and record
    each verdict in ``server.health``; runs until cancelled."""
    interval = server.options.health_interval
    task_status.started()
    while True:
        await trio.sleep(interval)
        while server.sessions or server.draining:  # a client holds the board: test it once it is free
            await trio.sleep(IDLE_POLL)
        problems = [f"the self-test did not finish within {TEST_TIMEOUT:g} s"]
        with trio.move_on_after(TEST_TIMEOUT):
            problems = await trio.to_thread.run_sync(_run, test, abandon_on_cancel=True)
        server.health.record(problems)
