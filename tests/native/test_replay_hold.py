"""The worker's side of a loan (``rpcsrv.native.replay.hold``), on socket pairs: what it answers, and
that whatever it does not answer stays on the socket, untouched, for the server.

The "client" here writes raw packets; the entries and bound calls are made by hand, so each rule of the
loop is checked alone: a recorded request is consumed and answered, another is left whole (peeked, never
read), a request arriving in pieces waits for its end, a handle's count never goes below zero, an idle
or closed client and the server's word end the loan, a call whose result differs goes back with it.
"""

from __future__ import annotations

import mmap
import socket
import threading
import time

import pytest

from rpcsrv.native import replay
from rpcsrv.native.wire import Shared, decode_head, encode_call


class FakeState:
    """What ``hold`` needs of ``WorkerState``: the bound calls, by frame."""

    def __init__(self):
        self.bound = {}
        self.runs = 0

    def bind(self, frame: bytes, fn=None) -> None:
        _budget, oid, _nargs, at = decode_head(bytearray(frame))
        self.bound[(oid, bytes(frame[at:]))] = fn or self._run

    def _run(self):
        self.runs += 1

    def to_wire(self, v):
        return v


def _packet(body: bytes) -> bytes:
    return len(body).to_bytes(8, "little") + body


CALL = _packet(b"\x04\x00\x00\x00call-request-bytes")
GET = _packet(b"\x04\x00\x00\x00get-request")
FREE = _packet(b"\x05\x00\x00\x00free-request")
FRAME = encode_call(7, None, [Shared("session", 0, "<f4", (4,), (4,))])
H = 0x7E00_0000_1000


@pytest.fixture
def pair():
    server_end, client = socket.socketpair()
    ctl_server, ctl_worker = socket.socketpair()
    server_end.setblocking(False)  # as the server's socket is: its flags are shared with the worker
    page = mmap.mmap(-1, replay.PAGE_SIZE)
    yield server_end, client, ctl_server, ctl_worker, page
    for s in (server_end, client, ctl_server, ctl_worker):
        s.close()


def _entries():
    return [(CALL, "call", H, FRAME, b"answer-call"), (GET, "get", H, b"", b"answer-get"),
            (FREE, "free", H, b"", b"answer-free")]


def _hold(state, pair, counts, entries=None):
    server_end, _client, _ctl_server, ctl_worker, page = pair
    return replay.hold(state, ctl_worker, server_end, page, entries or _entries(), counts)


def _read(sock, n, timeout=5.0):
    sock.settimeout(timeout)
    data = b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data


def test_recorded_requests_are_answered_and_others_left_whole(pair, monkeypatch):
    monkeypatch.setattr(replay, "IDLE_RETURN", 0.2)
    state = FakeState()
    state.bind(FRAME)
    server_end, client, *_ = pair
    other = _packet(b"\x04\x00\x00\x00another-request!!")
    client.sendall(CALL + b"")
    result = {}
    t = threading.Thread(target=lambda: result.update(_hold(state, pair, {H: 1})))
    t.start()
    assert _read(client, len(b"answer-call")) == b"answer-call"
    client.sendall(FREE)
    assert _read(client, len(b"answer-free")) == b"answer-free"
    client.sendall(GET)
    assert _read(client, len(b"answer-get")) == b"answer-get"
    client.sendall(other)
    t.join(5)
    assert result["why"] == "other"
    assert result["served"] == [1, 1, 1] and state.runs == 1
    assert result["counts"] == {H: 1}  # one free, one get
    assert result["bytes_in"] == len(CALL) + len(FREE) + len(GET)
    server_end.setblocking(True)
    assert server_end.recv(100) == other  # the request it did not know: untouched, for the server


def test_a_request_in_pieces_waits_for_its_end(pair):
    state = FakeState()
    state.bind(FRAME)
    _server_end, client, *_ = pair
    result = {}
    t = threading.Thread(target=lambda: result.update(_hold(state, pair, {H: 1})))
    t.start()
    client.sendall(CALL[:5])
    time.sleep(0.0002)
    client.sendall(CALL[5:])
    assert _read(client, len(b"answer-call")) == b"answer-call"
    client.close()  # the client leaves: the loan ends
    t.join(5)
    assert result["why"] == "closed" and state.runs == 1


def test_counts_never_go_below_zero(pair):
    state = FakeState()
    state.bind(FRAME)
    server_end, client, *_ = pair
    client.sendall(FREE)
    result = _hold(state, pair, {H: 0})
    assert result["why"] == "other" and result["served"] == [0, 0, 0]
    server_end.setblocking(True)
    assert server_end.recv(100) == FREE  # the server answers it (an unknown handle)


def test_a_call_on_a_freed_handle_goes_to_the_server(pair):
    state = FakeState()
    state.bind(FRAME)
    _server_end, client, *_ = pair
    client.sendall(FREE)
    result = {}
    t = threading.Thread(target=lambda: result.update(_hold(state, pair, {H: 1})))
    t.start()
    assert _read(client, len(b"answer-free")) == b"answer-free"
    client.sendall(CALL)
    t.join(5)
    assert result["why"] == "other" and state.runs == 0 and result["counts"] == {H: 0}


def test_idle_client_and_the_servers_word_end_the_loan(pair, monkeypatch):
    monkeypatch.setattr(replay, "IDLE_RETURN", 0.02)
    state = FakeState()
    state.bind(FRAME)
    start = time.monotonic()
    assert _hold(state, pair, {H: 1})["why"] == "idle"
    assert time.monotonic() - start < 2
    monkeypatch.setattr(replay, "IDLE_RETURN", 5.0)
    _server_end, _client, ctl_server, _ctl_worker, _page = pair
    ctl_server.sendall(b"x")
    assert _hold(state, pair, {H: 1})["why"] == "asked"


def test_a_call_that_raises_or_returns_goes_back_with_its_result(pair):
    state = FakeState()

    def fails():
        raise RuntimeError("the kernel said no")

    state.bind(FRAME, fails)
    _server_end, client, *_, page = pair
    client.sendall(CALL)
    result = _hold(state, pair, {H: 1})
    assert result["why"] == "pending" and result["pending"] == ("err", "the kernel said no", 0)
    assert replay.PAGE_FORMAT.unpack_from(page, 0)[0] == replay.IDLE
    state.bind(FRAME, lambda: 42)
    client.sendall(CALL)
    assert _hold(state, pair, {H: 1})["pending"] == ("value", 42, 0)


def test_nothing_to_serve_without_a_bound_call(pair):
    """A call this worker holds no bound call for (a model run, copied arguments) is not lent."""
    assert _hold(FakeState(), pair, {H: 1})["why"] == "empty"
