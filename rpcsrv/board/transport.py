"""Socket I/O for one connection, tuned for RPC's strict request/answer rhythm.

An RPC client sends its next request a few tens of microseconds after it reads an answer.  Sleeping
in epoll right after answering costs a scheduler wake-up on every call (measured here: a trio echo
round trip of ~300 us against ~70 us when polling briefly first), so after each answer the transport
polls the socket for a short while before it parks in ``wait_readable``: ``poll(0)`` in bursts of
``BURST_SECONDS`` with a trio checkpoint between them (a checkpoint costs about a third of a round
trip, so a connection alone in the process polls without them), and every connection checkpoints at
least every ``YIELD_SECONDS``, also one whose client always has its next request ready, so no
client starves the others or the listener.  The spin polls rather than tries the read: a read takes
the socket's lock, which the client's packet then waits for (measured: 0.7 us more per round trip
with the TVM client, 6 us with ours), and a read that finds nothing raises inside CPython even where
Python sees no exception (the ``OSError`` is made, its message decoded, then dropped: ~1 us).  The
read that follows a ``poll`` goes through ``io.FileIO`` on a socket only the server holds (no method
lookup of ``socket.recv``, no flags); once a native worker also holds the socket (``share``: its code
may clear ``O_NONBLOCK``), every read says ``MSG_DONTWAIT`` itself.  Bytes are counted as the
syscalls report them.  Large bodies are received straight into the memory the protocol names
(``recv_into``) and sent from the caller's buffers without joining them.

Failure rules:

* idle: a wait for the peer (to send, or to take what we send) longer than ``idle_timeout`` raises
  :class:`IdleTimeout` (an ``OSError``), and the server drops the connection;
* cancellation mid-packet: a send cancelled after part of a packet went out marks the transport
  ``broken``, and every later send raises ``trio.BrokenResourceError``: the peer would read garbage
  after a half packet, so the only clean end is closing the connection.
"""

from __future__ import annotations

import io
import math
import os
import select
import socket
import time

import trio

SPIN_SECONDS = 300e-6
BURST_SECONDS = 30e-6  # the longest a waiting session polls without letting the others run
YIELD_SECONDS = 1e-3  # the longest a connection serves without a checkpoint (also one alone)
_FLAT = (bytes, bytearray)
#: every write, and every read once the socket is lent (``share``), says "do not wait" itself: the socket's own
#: O_NONBLOCK flag is shared with a native worker the connection is lent to (``baton.py``), whose code could
#: clear it and so block the event loop
_NOWAIT = socket.MSG_DONTWAIT


class IdleTimeout(OSError):
    """The peer neither sent nor received anything for the idle timeout; ``reading``: we were waiting
    for its bytes (else for it to take ours)."""

    def __init__(self, message: str, reading: bool):
        super().__init__(message)
        self.reading = reading


class Transport:
    """One connection's socket; ``bytes_in``/``bytes_out`` count what it moved (the session record),
    where the syscalls report it (no separate pass over the buffers)."""

    bytes_in = 0
    bytes_out = 0
    #: transports open in this process: a connection alone needs no pauses for the others
    open_count = 0

    def __init__(self, trio_socket, spin: float = SPIN_SECONDS, idle_timeout: float = math.inf):
        # a private duplicate of the descriptor, driven non-blocking with trio's readiness waits
        self.sock = socket.socket(fileno=os.dup(trio_socket.fileno()))
        self.sock.setblocking(False)
        self.spin = spin
        self.idle_timeout = idle_timeout
        self.broken = False  # a send was cancelled in the middle of a packet
        self._file = io.FileIO(self.sock.fileno(), "rb", closefd=False)
        self._read = self._file.read  # ``_read(n)``: up to n bytes, b"" at the peer's close, None if none yet
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        self._readable = poller.poll  # ``_readable(0)``: is a byte (or the peer's close) waiting?
        self._open = True
        Transport.open_count += 1
        self._yielded = time.perf_counter()  # when this connection last let the other tasks run

    async def _wait(self, wait) -> None:
        """Park until the socket is ready; only here does the idle clock run (never on the fast path)."""
        with trio.move_on_after(self.idle_timeout) as scope:
            await wait(self.sock)
        if scope.cancelled_caught:
            raise IdleTimeout(f"no progress for {self.idle_timeout:g} s", reading=wait is trio.lowlevel.wait_readable)

    async def _io(self, op, wait):
        deadline = time.perf_counter() + self.spin
        while True:
            try:
                return op()
            except (BlockingIOError, InterruptedError):
                pass
            if time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
            else:
                await self._wait(wait)

    def share(self) -> None:
        """The socket goes to a native worker (``baton.py``): from now on no read trusts the
        descriptor's ``O_NONBLOCK`` flag (the worker's code could clear it and so block the event loop)."""
        self._read = self._recv_nowait

    def _recv_nowait(self, n: int):
        try:
            return self.sock.recv(n, _NOWAIT)
        except (BlockingIOError, InterruptedError):
            return None

    async def recv(self, n: int) -> bytes:
        # the next request may be here already (a try that finds nothing costs more than a ``poll``,
        # but the client is busy then; and one syscall less when the bytes are here: one CPU)
        data = self._read(n)
        if data is None:
            data = await self._read_soon(n)
        if time.perf_counter() - self._yielded > YIELD_SECONDS:  # a client that always has its next
            await trio.lowlevel.checkpoint()  # request ready must not starve the other tasks
            self._yielded = time.perf_counter()
        self.bytes_in += len(data)
        return data

    async def _read_soon(self, n: int) -> bytes:
        """The client's next request: poll in bursts of BURST_SECONDS with a trio checkpoint between
        them, so other sessions are served (a connection alone in the process polls the whole while: a
        checkpoint costs about a third of a round trip); after ``spin`` seconds, park in trio's
        readiness wait."""
        clock, readable = time.perf_counter, self._readable
        now = clock()
        deadline = now + self.spin
        while now < deadline:
            burst = deadline if Transport.open_count == 1 else min(now + BURST_SECONDS, deadline)
            while now < burst:
                if readable(0):
                    data = self._read(n)  # (None: another reader took the bytes first)
                    if data is not None:
                        return data
                now = clock()
            await trio.lowlevel.checkpoint()
            self._yielded = now = clock()
        while True:
            await self._wait(trio.lowlevel.wait_readable)
            self._yielded = clock()
            data = self._read(n)
            if data is not None:
                return data

    async def recv_into(self, region: memoryview) -> int:
        n = await self._io(lambda: self.sock.recv_into(region, 0, _NOWAIT), trio.lowlevel.wait_readable)
        self.bytes_in += n
        return n

    async def send_all(self, parts: list) -> None:
        """Send every buffer in ``parts`` (one packet, small ones joined into one write).

        Cancellation is honoured only where the packet is whole (before its first byte or after its
        last); a cancel or failure after a first byte went out marks the transport ``broken``."""
        if self.broken:
            raise trio.BrokenResourceError("an earlier send stopped in the middle of a packet")
        if len(parts) > 1 and sum(memoryview(p).nbytes for p in parts) <= 1 << 16:
            parts = [b"".join(parts)]
        first = parts[0]
        if len(parts) == 1 and type(first) in _FLAT:  # the common case: one small answer
            # no checkpoint before it (0.2 us of a call's ~8 on the server): a packet sent whole is a
            # clean place to stop too, and ``recv`` checkpoints at least every YIELD_SECONDS
            try:  # it usually goes out in one send
                n = self.sock.send(first, _NOWAIT)
            except (BlockingIOError, InterruptedError):
                n = 0
            self.bytes_out += n  # counted as written
            if n == len(first):
                return
            parts = [memoryview(first)[n:]]
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
            n = 0
        sent = n
        try:
            for part in parts:
                if not len(part):
                    continue
                view = memoryview(part)
                if view.format != "B" or view.ndim != 1:
                    view = view.cast("B")
                while view:
                    try:
                        n = self.sock.send(view, _NOWAIT)
                    except (BlockingIOError, InterruptedError):
                        await self._wait(trio.lowlevel.wait_writable)
                        continue
                    view = view[n:]
                    sent += n
                    self.bytes_out += n
        except BaseException:
            self.broken = self.broken or sent > 0
            raise

    def close(self) -> None:
        if self._open:
            self._open = False
            Transport.open_count -= 1
        self._file.close()  # (it does not own the descriptor: a read after this fails, never reads a reused one)
        try:
            self.sock.close()
        except OSError:
            pass
