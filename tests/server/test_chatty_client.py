"""A client that always has its next request ready does not starve the server's other tasks.

The transport waits for a session's next request by polling instead of a trio checkpoint per try
(``board/transport.py``), and reads at once what is already there, so a connection whose peer always
has bytes waiting would never let the event loop run: no new connection accepted, no other session
answered.  ``YIELD_SECONDS`` bounds that: a connection checkpoints at least that often.
"""

from __future__ import annotations

import socket
import time

import trio

from rpcsrv.board.transport import YIELD_SECONDS, Transport


async def test_reads_that_never_wait_still_let_other_tasks_run():
    a, b = socket.socketpair()
    io = Transport(trio.socket.from_stdlib_socket(b))
    a.setblocking(False)
    total = 0
    try:  # fill the socket: there is always something to read, the reader never waits
        while total < 1 << 22:
            total += a.send(bytes(1 << 12))
    except BlockingIOError:
        pass
    ticks = []

    async def other_task():
        while True:
            await trio.sleep(0)
            ticks.append(time.perf_counter())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            await trio.sleep(0)
            # the reads' own CPU time bounds the loop: on a busy machine wall time passes while the
            # process waits for a core, which gives the other task no turn and must not count against it
            start = time.thread_time()
            ticks.clear()
            got = 0
            while time.thread_time() - start < 40 * YIELD_SECONDS and got < total:
                got += len(await io.recv(8))
            elapsed = time.thread_time() - start
            nursery.cancel_scope.cancel()
    finally:
        io.close()
        a.close()
        b.close()
    assert got > 0 and io.bytes_in == got
    assert len(ticks) >= 5, f"other tasks ran {len(ticks)} times in {elapsed * 1e3:.0f} ms of the reads' CPU time"
