"""How the transport reads (``board/transport.py``): it polls for the client's next request, then parks;
it reads with ``io.FileIO`` (``None`` for "nothing yet") while the socket is the server's alone, and with
``MSG_DONTWAIT`` once a native worker shares it (``share``), whose code may clear ``O_NONBLOCK`` on the
descriptor they share: such a read must never block the event loop."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import trio

from rpcsrv.board.transport import SPIN_SECONDS, Transport


async def _recv_while_ticking(io: Transport, n: int = 64) -> tuple[bytes, int]:
    """``io.recv(n)`` while another task ticks every millisecond; the bytes and the ticks seen."""
    ticks = []

    async def other_task():
        while True:
            await trio.sleep(0.001)
            ticks.append(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        data = await io.recv(n)
        nursery.cancel_scope.cancel()
    return data, len(ticks)


async def test_a_request_that_comes_after_the_spin_is_read_and_the_loop_runs_meanwhile():
    a, b = socket.socketpair()
    io = Transport(trio.socket.from_stdlib_socket(b))
    late = threading.Timer(max(0.2, 100 * SPIN_SECONDS), a.send, [b"late request"])
    try:
        late.start()
        data, ticks = await _recv_while_ticking(io)
        assert data == b"late request" and io.bytes_in == len(data)
        assert ticks > 20, f"the other task ran {ticks} times while the transport waited 0.2 s"
        a.send(b"at once")  # already there: read on the first try
        assert await io.recv(64) == b"at once"
        a.close()
        assert await io.recv(64) == b""  # the peer's close
        io.close()
        spare = socket.socketpair()  # a descriptor the closed one's number may now name
        try:
            with pytest.raises(ValueError):
                await io.recv(64)
        finally:
            for s in spare:
                s.close()
    finally:
        late.cancel()
        io.close()
        b.close()


async def test_a_shared_socket_never_trusts_its_nonblocking_flag():
    a, b = socket.socketpair()
    io = Transport(trio.socket.from_stdlib_socket(b))
    io.share()
    os.set_blocking(io.sock.fileno(), True)  # what a worker holding the descriptor may do
    late = threading.Timer(0.2, a.send, [b"late request"])
    try:
        late.start()
        data, ticks = await _recv_while_ticking(io)
        assert data == b"late request"
        assert ticks > 20, f"a read blocked the event loop: the other task ran {ticks} times in 0.2 s"
    finally:
        late.cancel()
        io.close()
        a.close()
        b.close()
