"""Sans-IO connection: the same bytes give the same events however the socket splits them, large
copies land in the target memory, and broken streams end in ConnectionClosed, never an exception."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpcsrv.protocol import (NEED_DATA, CallFunc, CallFuncChunk, CallFuncEnd, CallFuncStart, Connection,
                             ConnectionClosed, CopyAck, CopyToRemote,
                             CopyToRemoteStart, DataType, Device, Dialect, HandshakeDone, HandshakeRequest, Role,
                             Shutdown, Syscall, TensorHeader, RPCCode)

BIG = 200_000
TENSOR = TensorHeader(0x5000, Device(1, 0), DataType(1, 8, 1), (BIG,), 0)


def client_stream(payload: bytes) -> bytes:
    c = Connection(Role.CLIENT, strict=False, dialect=Dialect.FFI)
    parts = [c.start("k -timeout=5")]
    parts += c.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["tvm.rpc.server.upload"])
    parts += c.send_copy_to_remote(TENSOR, payload)
    parts += c.send_call(0x77, ["big.bin", payload])
    parts += c.send_shutdown()
    return b"".join(bytes(p) for p in parts)


def drive(data: bytes, cuts: list[int], use_recv_into: bool, stream: bool = False):
    """Feed ``data`` to a server connection in pieces; return its events and the copy target.

    ``stream``: answer CallFuncStart by streaming (chunk events carry copies of their data)."""
    conn = Connection(Role.SERVER, strict=False)
    target = np.zeros(BIG, np.uint8)
    events, pos = [], 0
    cuts = sorted(set(c % (len(data) + 1) for c in cuts)) + [len(data)]
    for cut in cuts:
        chunk = memoryview(data)[pos:cut]
        pos = cut
        while chunk:
            region = conn.writable() if use_recv_into else None
            if region is not None:
                n = min(len(region), len(chunk))
                region[:n] = chunk[:n]
                conn.advance(n)
                chunk = chunk[n:]
            else:
                conn.receive_data(chunk)
                chunk = chunk[:0]
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA:
                    break
                if isinstance(ev, CallFuncChunk):  # its data is only valid until the next call
                    ev = CallFuncChunk(memoryview(bytes(ev.data)))
                events.append(ev)
                if isinstance(ev, CallFuncStart):
                    conn.stream_call(stream)
                if isinstance(ev, HandshakeRequest):
                    conn.accept("")
                if isinstance(ev, CopyToRemoteStart):
                    conn.set_copy_target(memoryview(target))
    conn.receive_data(b"")
    events.append(conn.next_event())
    return events, target


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10 ** 6), max_size=12), st.booleans(), st.booleans())
def test_any_chunking_gives_the_same_events(cuts, use_recv_into, stream):
    payload = bytes(np.random.default_rng(1).integers(0, 256, BIG, dtype=np.uint8))
    events, target = drive(client_stream(payload), cuts, use_recv_into, stream)
    kinds = [type(e) for e in events]
    assert events[0].key == "k" and events[0].options == {"timeout": "5"}
    assert kinds[:5] == [HandshakeRequest, Syscall, CopyToRemoteStart, CopyToRemote, CallFuncStart]
    copy = events[3]
    assert copy.in_place and copy.tensor == TENSOR and bytes(target) == payload
    start = events[4]
    assert start.handle == 0x77 and start.args == ["big.bin"] and start.nbytes == BIG
    if stream:  # the bytes come in pieces through one bounded buffer, then the end of the call
        pieces = [e for e in events[5:-3]]
        assert all(isinstance(e, CallFuncChunk) and 0 < len(e.data) <= 1 << 20 for e in pieces)
        assert b"".join(bytes(e.data) for e in pieces) == payload
        assert isinstance(events[-3], CallFuncEnd) and events[-3].handle == 0x77
    else:  # declined: the whole call as usual
        assert kinds[5:-2] == [CallFunc]
        call = events[5]
        assert call.handle == 0x77 and call.args[0] == "big.bin" and bytes(call.args[1]) == payload
    assert kinds[-2:] == [Shutdown, ConnectionClosed] and events[-1].clean


def test_streamed_call_comes_in_bounded_pieces():
    """A 5 MB upload streams through a buffer of 1 MB: pieces never exceed it, bytes arrive in order."""
    payload = bytes(np.random.default_rng(2).integers(0, 256, 5 << 20, dtype=np.uint8))
    c = Connection(Role.CLIENT, strict=False, dialect=Dialect.FFI)
    data = b"".join(bytes(p) for p in [c.start("")] + c.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["f"])
                    + c.send_call(0x77, ["big.bin", payload]))
    events, _ = drive(data, [3 << 20], True, stream=True)
    pieces = [e for e in events if isinstance(e, CallFuncChunk)]
    assert len(pieces) >= 5 and max(len(e.data) for e in pieces) <= 1 << 20
    assert b"".join(bytes(e.data) for e in pieces) == payload


@pytest.mark.parametrize("dialect", [Dialect.CLASSIC, Dialect.FFI])
def test_uploads_stream_in_both_dialects(dialect):
    c = Connection(Role.CLIENT, strict=False, dialect=dialect)
    server = Connection(Role.SERVER, strict=False, dialect=dialect)
    server.receive_data(b"".join(bytes(p) for p in [c.start("")] + c.send_call(0x77, ["m.so", bytes(BIG)])))
    assert isinstance(server.next_event(), HandshakeRequest)
    server.accept("")
    start = server.next_event()
    assert isinstance(start, CallFuncStart) and start.args == ["m.so"] and start.nbytes == BIG


def test_only_calls_ending_in_bytes_stream():
    """A large call whose last argument is not bytes (or whose dialect is unknown) stays whole."""
    c = Connection(Role.CLIENT, strict=False, dialect=Dialect.FFI)
    data = b"".join(bytes(p) for p in [c.start("")] + c.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["f"])
                    + c.send_call(0x77, [bytes(BIG), "name.bin"]))
    events, _ = drive(data, [], False, stream=True)
    assert [type(e) for e in events][-2:] == [CallFunc, ConnectionClosed]
    fresh = Connection(Role.SERVER, strict=False)  # dialect not known yet: no streaming
    fresh.receive_data(b"".join(bytes(p) for p in [c.start("")] + c.send_call(0x77, ["n", bytes(BIG)])))
    assert isinstance(fresh.next_event(), HandshakeRequest)
    fresh.accept("")
    assert isinstance(fresh.next_event(), CallFunc)


def test_rejected_copy_target_discards_the_body_and_reports():
    payload = bytes(BIG)
    data = client_stream(payload)
    conn = Connection(Role.SERVER, strict=False)
    conn.receive_data(data)
    seen = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA:
            break
        seen.append(ev)
        if isinstance(ev, HandshakeRequest):
            conn.accept("")
        if isinstance(ev, CopyToRemoteStart):
            conn.set_copy_target(None, "no such buffer")
        if isinstance(ev, CallFuncStart):
            conn.stream_call(False)
    names = [type(e).__name__ for e in seen]
    assert names == ["HandshakeRequest", "Syscall", "CopyToRemoteStart", "BadPacket", "CallFuncStart",
                     "CallFunc", "Shutdown"]
    assert seen[3].error == "no such buffer"


def test_client_receives_copy_ack_in_place():
    server = Connection(Role.SERVER, strict=False, dialect=Dialect.FFI)
    client = Connection(Role.CLIENT, strict=False, dialect=Dialect.FFI)
    client.start()
    client.receive_data(server.accept())  # the public way past the handshake
    assert isinstance(client.next_event(), HandshakeDone)
    payload = np.arange(BIG, dtype=np.uint8)
    out = np.empty(BIG, np.uint8)
    client.expect_copy_ack(memoryview(out))
    client.receive_data(b"".join(bytes(p) for p in server.send_copy_ack(memoryview(payload))))
    ev = client.next_event()
    assert isinstance(ev, CopyAck) and ev.data.obj is out
    np.testing.assert_array_equal(out, payload)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_after_handshake_never_raises(data):
    conn = Connection(Role.SERVER, strict=False)
    conn.receive_data(Connection(Role.CLIENT, strict=False).start(""))
    assert isinstance(conn.next_event(), HandshakeRequest)
    conn.accept("")
    conn.receive_data(data)
    conn.receive_data(b"")
    for _ in range(100):
        ev = conn.next_event()
        if isinstance(ev, ConnectionClosed):
            break
    else:
        raise AssertionError("no ConnectionClosed at the end of the stream")


def test_rejected_copy_larger_than_the_discard_buffer_when_all_of_it_is_buffered():
    """A refused multi-MB copy whose bytes were all received at once is discarded to its end (the
    discard buffer is reused: the connection must not wait for bytes it already holds)."""
    payload = bytes(3 << 20)
    events, _ = drive(client_stream(payload), [], False)
    kinds = [type(e).__name__ for e in events]
    assert kinds[:4] == ["HandshakeRequest", "Syscall", "CopyToRemoteStart", "BadPacket"], kinds
    assert kinds[-2:] == ["Shutdown", "ConnectionClosed"] and events[-1].clean
