"""The worker's side of a loan (``rpcsrv.native.replay.hold``), on socket pairs: what it answers, and
that whatever it does not answer goes back to the server whole, byte for byte (``unread``).

The "client" here writes raw packets; the entries and bound calls are made by hand, so each rule of the
loop is checked alone: a recorded request is read and answered, another goes back as read, a request
arriving in pieces is read to its end, a handle's count never goes below zero, an idle or closed client
ends the loan, a call whose result differs goes back with it, and the socket is left as it was found.
"""

from __future__ import annotations

import contextlib
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
    server_end, _client, _ctl_server, _ctl_worker, page = pair
    result = replay.hold(state, server_end, page, entries or _entries(), counts)
    assert server_end.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16)  # as found
    return result


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
    assert result["unread"] == other  # the request it did not know: back to the server as read


def test_a_request_in_pieces_waits_for_its_end(pair):
    state = FakeState()
    state.bind(FRAME)
    _server_end, client, *_ = pair
    result = {}
    t = threading.Thread(target=lambda: result.update(_hold(state, pair, {H: 1})))
    t.start()
    client.sendall(CALL[:5])
    time.sleep(0.01)
    client.sendall(CALL[5:12])
    time.sleep(0.01)
    client.sendall(CALL[12:])
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
    assert result["unread"] == FREE  # the server answers it (an unknown handle)


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
    assert result["unread"] == CALL


def test_an_idle_client_ends_the_loan(pair, monkeypatch):
    monkeypatch.setattr(replay, "IDLE_RETURN", 0.02)
    state = FakeState()
    state.bind(FRAME)
    start = time.monotonic()
    result = _hold(state, pair, {H: 1})
    assert result["why"] == "idle" and result["unread"] == b""
    assert time.monotonic() - start < 2


def test_a_partial_request_left_by_an_idle_client_goes_back(pair, monkeypatch):
    monkeypatch.setattr(replay, "IDLE_RETURN", 0.02)
    state = FakeState()
    state.bind(FRAME)
    _server_end, client, *_ = pair
    client.sendall(CALL[:9])
    result = _hold(state, pair, {H: 1})
    assert result["unread"] == CALL[:9] and state.runs == 0


def test_a_call_that_raises_or_returns_goes_back_with_its_result(pair):
    state = FakeState()

    def fails():
        raise RuntimeError("the kernel said no")

    state.bind(FRAME, fails)
    _server_end, client, *_, page = pair
    client.sendall(CALL)
    result = _hold(state, pair, {H: 1})
    assert result["why"] == "pending" and result["pending"] == ("err", "the kernel said no", 0)
    assert replay.PAGE_FORMAT.unpack_from(page, 0)[0] == replay.READING  # the request is the server's
    state.bind(FRAME, lambda: 42)
    client.sendall(CALL)
    assert _hold(state, pair, {H: 1})["pending"] == ("value", 42, 0)


def test_nothing_to_serve_without_a_bound_call(pair):
    """A call this worker holds no bound call for (a model run, copied arguments) is not lent."""
    assert _hold(FakeState(), pair, {H: 1})["why"] == "empty"


# ---------------------------------------------------------------------------- the loop in C (shim.c)
@pytest.fixture(scope="module")
def native(tmp_path_factory):
    from native_helpers import build_c
    from rpcsrv.native import load_native_module

    lib = load_native_module(str(build_c("loan_kernels", tmp_path_factory.mktemp("loan"))))
    old = load_native_module(str(build_c("c_target_kernels", tmp_path_factory.mktemp("old"))))
    return lib, old


def _native_state(fn, *arrays):
    """A state whose one bound call is the real native ``fn`` on ``arrays`` (as the worker binds it)."""
    state = FakeState()
    state.bind(FRAME, fn.bind(*arrays, hold=False, returns=True))
    assert hasattr(state.bound[next(iter(state.bound))], "parts")  # what the C loop needs
    return state


def _serve(state, pair, counts, sends):
    """Run ``hold`` in a thread while the client sends ``sends`` one by one, each answered before the next;
    returns the result and the answers read."""
    _server_end, client, *_ = pair
    result, answers = {}, []
    t = threading.Thread(target=lambda: result.update(_hold(state, pair, counts)))
    t.start()
    for packet, answer_len in sends:
        client.sendall(packet)
        if answer_len:
            answers.append(_read(client, answer_len))
    client.shutdown(socket.SHUT_WR)
    t.join(10)
    assert not t.is_alive()
    return result, answers


def test_the_c_loop_runs_each_call_once(pair, native, monkeypatch):
    import numpy as np

    monkeypatch.delenv("RPCSRV_LOAN_LOOP", raising=False)  # the C loop
    a, b = np.arange(8, dtype="float32"), np.zeros(8, "float32")
    state = _native_state(native[0].get_function("accumulate"), a, b)
    sends = [(CALL, 11), (FREE, 11), (GET, 10), (CALL, 11)] * 50
    result, answers = _serve(state, pair, {H: 1}, sends)
    np.testing.assert_array_equal(b, 100 * a)  # ran 100 times, in C
    assert answers == [b"answer-call", b"answer-free", b"answer-get", b"answer-call"] * 50
    assert result["served"] == [100, 50, 50] and result["counts"] == {H: 1}
    assert result["why"] == "closed" and result["bytes_in"] == 50 * (2 * len(CALL) + len(FREE) + len(GET))
    assert all(s > 0 for s in result["seconds"])


def test_the_c_loop_gives_back_what_it_does_not_answer(pair, native, monkeypatch):
    import numpy as np

    monkeypatch.delenv("RPCSRV_LOAN_LOOP", raising=False)  # the C loop
    a, b = np.ones(8, "float32"), np.zeros(8, "float32")
    state = _native_state(native[0].get_function("accumulate"), a, b)
    other = _packet(b"\x04\x00\x00\x00another-request!!")
    result, _ = _serve(state, pair, {H: 1}, [(CALL, 11), (CALL[:7], 0), (CALL[7:], 11), (other, 0)])
    assert result["why"] == "other" and result["unread"] == other and result["served"] == [2, 0, 0]
    with _fresh(pair) as again:
        result, _ = _serve(state, again, {H: 0}, [(CALL, 0)])  # a handle the session no longer holds
    assert result["why"] == "other" and result["unread"] == CALL
    np.testing.assert_array_equal(b, 2 * a)


def test_the_c_loop_leaves_errors_and_values_to_the_server(pair, native, monkeypatch):
    import numpy as np

    monkeypatch.delenv("RPCSRV_LOAN_LOOP", raising=False)  # the C loop
    fn = native[0].get_function("count_or_fail")
    limit, count = np.full(1, 2, "float32"), np.zeros(1, "float32")
    state = _native_state(fn, limit, count)
    result, answers = _serve(state, pair, {H: 1}, [(CALL, 11), (CALL, 11), (CALL, 0)])
    with pytest.raises(Exception) as direct:  # the same call on the usual path
        fn(limit, np.full(1, 5, "float32"))
    assert result["why"] == "pending" and result["pending"] == ("err", str(direct.value), 0)
    assert "count_or_fail: past the limit" in str(direct.value)
    assert count[0] == 3 and result["served"] == [2, 0, 0]
    assert replay.PAGE_FORMAT.unpack_from(pair[4], 0) == (replay.READING, 0)

    state = FakeState()
    state.bind(FRAME, native[1].get_function("twice_plus_one").bind(20, hold=False, returns=True))
    with _fresh(pair) as again:
        again[1].sendall(CALL)
        result = _hold(state, again, {H: 1})
    assert result["why"] == "pending" and result["pending"] == ("value", 41, 0)


@contextlib.contextmanager
def _fresh(pair):
    """A new client connection, with the same server socket pair and page as ``pair``."""
    server_end, client = socket.socketpair()
    try:
        yield (server_end, client, *pair[2:])
    finally:
        server_end.close()
        client.close()
