"""Sans-IO connection: the same bytes give the same events however the socket splits them, large
copies land in the target memory, and broken streams end in ConnectionClosed, never an exception."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rpcsrv.protocol import (NEED_DATA, CallFunc, Connection, ConnectionClosed, CopyAck, CopyToRemote,
                             CopyToRemoteStart, DataType, Device, Dialect, HandshakeRequest, Role,
                             Shutdown, Syscall, TensorHeader, RPCCode)

BIG = 200_000
TENSOR = TensorHeader(0x5000, Device(1, 0), DataType(1, 8, 1), (BIG,), 0)


def client_stream(payload: bytes) -> bytes:
    c = Connection(Role.CLIENT, dialect=Dialect.FFI)
    parts = [c.start("k -timeout=5")]
    parts += c.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["tvm.rpc.server.upload"])
    parts += c.send_copy_to_remote(TENSOR, payload)
    parts += c.send_call(0x77, ["big.bin", payload])
    parts += c.send_shutdown()
    return b"".join(bytes(p) for p in parts)


def drive(data: bytes, cuts: list[int], use_recv_into: bool):
    """Feed ``data`` to a server connection in pieces; return its events and the copy target."""
    conn = Connection(Role.SERVER)
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
                events.append(ev)
                if isinstance(ev, HandshakeRequest):
                    conn.accept("")
                if isinstance(ev, CopyToRemoteStart):
                    conn.set_copy_target(memoryview(target))
    conn.receive_data(b"")
    events.append(conn.next_event())
    return events, target


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10 ** 6), max_size=12), st.booleans())
def test_any_chunking_gives_the_same_events(cuts, use_recv_into):
    payload = bytes(np.random.default_rng(1).integers(0, 256, BIG, dtype=np.uint8))
    events, target = drive(client_stream(payload), cuts, use_recv_into)
    kinds = [type(e) for e in events]
    assert kinds == [HandshakeRequest, Syscall, CopyToRemoteStart, CopyToRemote, CallFunc, Shutdown,
                     ConnectionClosed]
    assert events[0].key == "k" and events[0].options == {"timeout": "5"}
    copy = events[3]
    assert copy.in_place and copy.tensor == TENSOR and bytes(target) == payload
    call = events[4]
    assert call.handle == 0x77 and call.args[0] == "big.bin" and bytes(call.args[1]) == payload
    assert events[-1].clean


def test_rejected_copy_target_discards_the_body_and_reports():
    payload = bytes(BIG)
    data = client_stream(payload)
    conn = Connection(Role.SERVER)
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
    names = [type(e).__name__ for e in seen]
    assert names == ["HandshakeRequest", "Syscall", "CopyToRemoteStart", "BadPacket", "CallFunc", "Shutdown"]
    assert seen[3].error == "no such buffer"


def test_client_receives_copy_ack_in_place():
    server = Connection(Role.SERVER, dialect=Dialect.FFI)
    client = Connection(Role.CLIENT, dialect=Dialect.FFI)
    client._state = "packets"
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
    conn = Connection(Role.SERVER)
    conn.receive_data(Connection(Role.CLIENT).start(""))
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
