"""Keep a board registered with a TVM RPC tracker (``rpcsrv serve --tracker HOST:PORT --key K``).

The messages and the match-key policy are in :mod:`rpcsrv.protocol.tracker` (sans-IO); this task only
moves their bytes.  Life of a registration, as TVM's own server does it:

1. connect, exchange the tracker magic, UPDATE_INFO (who we are), PUT one match key;
2. every ``ping_period`` seconds ask for the pending match keys (a liveness check both ways); a key
   handed to a client that never came is replaced;
3. the server admits a client only with the match key on offer (:meth:`admit`); when that session
   ends (:meth:`release`) a fresh key is PUT at once;
4. a lost tracker (restart, network) is reconnected with exponential backoff capped at
   ``max_backoff`` seconds, then step 1 again;
5. cancelling :meth:`run` closes the connection, which makes the tracker drop the board's queue
   entries (it does so for connections that sent UPDATE_INFO): the board leaves cleanly;
6. :meth:`pause` (the board's self-test fails, ``rpcsrv.board.health``) leaves the same way but keeps the
   task: no client is admitted, nothing is sent, until :meth:`resume` registers the board again (step 1).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Optional

import trio

from ..protocol import tracker as tp

log = logging.getLogger("rpcsrv.tracker")


class TrackerRegistration:
    def __init__(self, host: str, port: int, key: str, board_port: int, custom_addr: Optional[str] = None,
                 ping_period: float = 2.0, first_backoff: float = 0.25, max_backoff: float = 2.0):
        self.addr = (host, port)
        self.slot = tp.BoardSlot(key=key, port=board_port, custom_addr=custom_addr)
        self.ping_period = ping_period
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.connected = False
        self.registrations = 0  # successful (re)connections, for tests and logs
        self._wake = trio.Event()
        self._sock: Optional[trio.socket.SocketType] = None
        self._reader = tp.MessageReader()
        self._scope: Optional[trio.CancelScope] = None
        self._link: Optional[trio.CancelScope] = None  # one connection's life (closed by pause)
        self.paused: Optional[str] = None  # why the board stays away from the tracker, while it does
        self._resumed = trio.Event()

    # ------------------------------------------------------------------ gate used by the server
    def admit(self, client_key: Optional[str]) -> bool:
        """Open a session only for the match key the tracker handed out (each key opens one), and none while
        paused (a key handed out before the board left is void)."""
        return self.paused is None and self.slot.admit(client_key)

    def release(self) -> None:
        """A tracker session ended: offer the board again."""
        self.slot.session_done()
        self._wake.set()

    def pause(self, reason: str) -> None:
        """Leave the tracker until :meth:`resume` (the connection closes: the tracker forgets the board)."""
        if self.paused is None:
            self.paused, self._resumed = reason, trio.Event()
            if self._link is not None:
                self._link.cancel()

    def resume(self) -> None:
        """Register again after :meth:`pause`."""
        self.paused = None
        self._resumed.set()

    def health_changed(self, ok: bool, reason: str) -> None:
        """The board's self-test verdict (``Health.watch``): leave while it fails, rejoin when it passes."""
        if ok:
            self.resume()
        else:
            self.pause(reason)

    def leave(self) -> None:
        """Stop registering and close the tracker connection (the tracker forgets the board)."""
        if self._scope is not None:
            self._scope.cancel()

    # ------------------------------------------------------------------ the task
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Register, stay registered, reconnect; returns when :meth:`leave` is called."""
        started = False
        backoff = self.first_backoff
        with trio.CancelScope() as self._scope:
            while True:
                if self.paused is not None:
                    if not started:
                        task_status.started()
                        started = True
                    log.warning("left tracker %s:%d: %s", *self.addr, self.paused)
                    await self._resumed.wait()
                    backoff = self.first_backoff
                with trio.CancelScope() as self._link:
                    if self.paused is not None:  # paused again before the scope existed
                        self._link.cancel()
                    try:
                        await self._connect()
                        backoff = self.first_backoff
                        if not started:
                            task_status.started()
                            started = True
                        await self._serve_tracker()
                    except (OSError, trio.BrokenResourceError, tp.TrackerError) as exc:
                        if self.connected:
                            log.warning("tracker %s:%d lost (%s); reconnecting", *self.addr, exc)
                        else:
                            log.info("tracker %s:%d unreachable (%s); retry in %.2gs", *self.addr, exc, backoff)
                    finally:
                        self._close()
                self._link = None
                if not started:  # let the server start even while the tracker is down
                    task_status.started()
                    started = True
                if self.paused is not None:
                    continue
                await trio.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)
        log.info("left tracker %s:%d", *self.addr)

    async def _connect(self) -> None:
        self._reader = tp.MessageReader()
        family = socket.AF_INET6 if ":" in self.addr[0] else socket.AF_INET
        self._sock = trio.socket.socket(family, socket.SOCK_STREAM)
        with trio.fail_after(10):
            await self._sock.connect(self.addr)
            await self._send_raw(tp.MAGIC_BYTES)
            tp.check_magic(await self._recv_exact(4))
            tp.expect_success(await self._ask(self.slot.hello()), "UPDATE_INFO")
            self.slot.matchkey = None  # a restarted tracker knows no key of ours
            if self.slot.busy == 0:
                tp.expect_success(await self._ask(self.slot.offer()), "PUT")
        self.connected = True
        self.registrations += 1
        log.info("registered with tracker %s:%d as %r", *self.addr, self.slot.key)

    async def _serve_tracker(self) -> None:
        while True:
            with trio.move_on_after(self.ping_period):
                await self._wake.wait()
            self._wake = trio.Event()
            with trio.fail_after(10):
                if self.slot.matchkey is None and self.slot.busy == 0:
                    tp.expect_success(await self._ask(self.slot.offer()), "PUT")
                    continue
                renewed = self.slot.on_pending(await self._ask(tp.pending_matchkeys()), time.monotonic())
                if renewed is not None:
                    log.info("match key unused; offering a new one")
                    tp.expect_success(await self._ask(renewed), "PUT")

    # ------------------------------------------------------------------ bytes
    async def _ask(self, message: list):
        await self._send_raw(tp.encode(message))
        while True:
            answers = self._reader.feed(await self._recv_some())
            if answers:
                if len(answers) > 1 or self._reader.pending:
                    raise tp.TrackerError("the tracker answered more than asked")
                return answers[0]

    async def _send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[await self._sock.send(view):]

    async def _recv_some(self) -> bytes:
        data = await self._sock.recv(1 << 16)
        if not data:
            raise trio.BrokenResourceError("the tracker closed the connection")
        return data

    async def _recv_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            data = await self._sock.recv(n - len(out))
            if not data:
                raise trio.BrokenResourceError("the tracker closed the connection")
            out += data
        return out

    def _close(self) -> None:
        self.connected = False
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def parse_hostport(text: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) → (host, port); ValueError with a clear message."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)
