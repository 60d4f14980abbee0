"""The small-call path's shortcuts say nothing new: each is checked against the general path it
stands for.

* a plain value's return packet, made from a head fixed per dialect and type, is byte for byte what
  encoding ``pack_return``'s sequence gives, and the client reads the value back;
* the per-role, per-state dispatch dicts are the transition table, entry for entry;
* a call's code and handle read in one unpack, and the dialect's ``decode_seq``, agree with the
  general reader, also on short, truncated and unknown input.
"""

from __future__ import annotations

import struct

import pytest

from rpcsrv.protocol import (NEED_DATA, RPC_MAGIC, BadPacket, CallFunc, Connection, ConnectionClosed, DataType,
                             Device, Dialect, FunctionHandle, LocalProtocolError, Reader, Return, Role, RPCCode, State,
                             TensorHeader, decode_values, encode_values, pack_return, unpack_return)
from rpcsrv.protocol.codes import PROTOCOL_VERSION
from rpcsrv.protocol.readers import STREAM_MIN
from rpcsrv.protocol.codec import ProtocolError, Writer, encode_packed_seq
from rpcsrv.protocol.kinds import TABLES
from rpcsrv.protocol.states import (CLIENT_RECEIVES, RECEIVE_MOVES, SEND_MOVES, SENDS, SERVER_RECEIVES, STAY,
                                    TRANSITIONS)

PLAIN = [None, True, False, 0, -5, 2 ** 62, -(2 ** 63), 1.5, float("inf"), "", "abc", "ü" * 3000, "x" * 5000]


def _general(value, dialect: Dialect) -> bytes:
    w = Writer()
    w.i32(RPCCode.RETURN)
    encode_packed_seq(w, pack_return(value, dialect), dialect)
    body = b"".join(bytes(p) for p in w.finish())
    return struct.pack("<q", len(body)) + body


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_return_packet_is_the_general_encoding(dialect, value):
    packet = TABLES[dialect].return_packet(value)
    assert packet == _general(value, dialect)
    client = Connection(Role.CLIENT, dialect=dialect, strict=False)
    client._state = State.IDLE
    client.receive_data(packet)
    ev = client.next_event()
    assert isinstance(ev, Return)
    back = unpack_return(ev.values, dialect)
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_other_values_take_the_general_path(dialect):
    header = TensorHeader(0x1000, Device(1, 0), DataType(2, 32, 1), (2, 3), 0)
    for value in (b"ab", Device(1, 0), FunctionHandle(7), header):
        assert TABLES[dialect].return_packet(value) is None
    server = Connection(Role.SERVER, dialect=dialect, strict=False)
    parts = server.send_value(FunctionHandle(7))
    assert b"".join(bytes(p) for p in parts) == _general(FunctionHandle(7), dialect)


def test_dispatch_dicts_are_the_transition_table():
    for role in Role:
        receives = SERVER_RECEIVES if role is Role.SERVER else CLIENT_RECEIVES
        for state in State:
            sends = SEND_MOVES[(role, True)][state]
            for action in SENDS[role]:
                assert sends.get(action) == TRANSITIONS.get((role, state, action)), (role, state, action)
            moves = RECEIVE_MOVES[(role, True)][state]
            for kind, action in receives.items():
                expected = TRANSITIONS.get((role, state, action))
                if kind.__name__ == "RemoteError" and state is State.IDLE and action == "answer":
                    expected = TRANSITIONS.get((role, state, "notice"))
                assert moves[kind] == expected, (role, state, kind)
            assert RECEIVE_MOVES[(role, True)][state].get(object, STAY) is STAY


@pytest.mark.parametrize("dialect", list(Dialect))
def test_decode_seq_agrees_with_the_general_reader(dialect):
    values = [1, -2.5, "name", b"\x00\x01", Device(1, 0), None, True, FunctionHandle(9)]
    data = encode_values(values, dialect)
    table = TABLES[dialect]
    r = Reader(memoryview(data))
    n = r.i32()
    if dialect is Dialect.CLASSIC:
        codes = [r.i32() for _ in range(n)]
        general = [table.read(r, c) for c in codes]
    else:
        general = [table.read(r, r.i32()) for _ in range(n)]
    fast = decode_values(data, dialect)
    assert [bytes(v) if isinstance(v, memoryview) else v for v in fast] == \
        [bytes(v) if isinstance(v, memoryview) else v for v in general]
    for cut in range(len(data)):  # every truncation is a ProtocolError, never another exception
        with pytest.raises(ProtocolError):
            decode_values(data[:cut], dialect)
    with pytest.raises(ProtocolError, match="unknown"):  # a code no kind has (below tvm-ffi's objects)
        decode_values(struct.pack("<ii", 1, 50) + bytes(8), dialect)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_call_packets_short_and_whole(dialect):
    server = Connection(Role.SERVER, dialect=dialect, strict=False)
    server._state = State.IDLE
    body = struct.pack("<iQ", RPCCode.CALL_FUNC, 0x7E00) + encode_values(["x", 3], dialect)
    server.receive_data(struct.pack("<q", len(body)) + body)
    ev = server.next_event()
    assert isinstance(ev, CallFunc) and ev.handle == 0x7E00 and ev.args == ["x", 3]
    short = struct.pack("<iI", RPCCode.CALL_FUNC, 1)  # no room for its 8-byte handle
    server.receive_data(struct.pack("<q", len(short)) + short)
    ev = server.next_event()
    assert isinstance(ev, BadPacket) and "function handle" in ev.error
    extra = body + b"\x00"
    server.receive_data(struct.pack("<q", len(extra)) + extra)
    ev = server.next_event()
    assert isinstance(ev, BadPacket) and "unexpected bytes" in ev.error


# -- next_event_in: a request read whole while the connection was drained, framed from the bytes as read --------
RECORDED = [("classic-sessions", n, Dialect.CLASSIC) for n in ("globals", "tensors", "files", "graph-executor")] + \
           [("ffi-sessions", n, Dialect.FFI) for n in ("globals", "tensors", "files")]


def _server_after_handshake(hello: bytes, strict: bool = False) -> Connection:
    conn = Connection(Role.SERVER, strict=strict)
    conn.receive_data(hello)
    conn.next_event()
    conn.accept()
    return conn


@pytest.mark.parametrize("folder,name,dialect", RECORDED, ids=[f"{f[:3]}-{n}" for f, n, _ in RECORDED])
def test_next_event_in_gives_the_events_of_the_general_path(folder, name, dialect):
    """Every request of the recorded sessions, once through ``receive_data`` + ``next_event`` and once through
    ``next_event_in``: the same events (re-encoded byte for byte), states and ``last_packet``."""
    from conftest import need_shared
    from recordings import packets, reencode

    items = [(k, d) for direction, k, d in packets(need_shared(folder, f"{name}.jsonl"))
             if direction == "c2s" and k != "elided"]
    (_, hello), requests = items[0], [d for _, d in items[1:]]
    general, fast = _server_after_handshake(hello, strict=True), _server_after_handshake(hello, strict=True)
    for data in requests:
        general.receive_data(data)
        expected = general.next_event()
        assert fast.drained()
        buffered = bytes(fast._buf)
        got = fast.next_event_in(bytes(data))
        if len(data) < STREAM_MIN:  # framed from the bytes as read: never copied into the buffer
            assert bytes(fast._buf) == buffered
        enc = Connection(Role.CLIENT, strict=False, dialect=dialect)  # (a request is a client's to encode)
        assert type(got) is type(expected) and reencode(enc, got) == reencode(enc, expected)
        assert fast.state is general.state and fast.last_packet == general.last_packet
        if general.state is State.ANSWERING:  # (strict: the next request only once this one is answered)
            general.send_exception("answered")
            fast.send_exception("answered")
        assert fast.next_event() is NEED_DATA and general.next_event() is NEED_DATA
    assert len(requests) >= 4


def test_next_event_in_leaves_everything_else_to_the_general_path():
    hello = struct.pack("<ii", RPC_MAGIC, 7) + b"client:"
    client = Connection(Role.CLIENT, dialect=Dialect.FFI, strict=False)
    client._state = State.IDLE
    one = b"".join(bytes(p) for p in client.send_call(5, ["x"]))
    conn = _server_after_handshake(hello)
    assert conn.next_event_in(one[:5]) is NEED_DATA and not conn.drained()  # a part: buffered
    conn.receive_data(one[5:])
    assert isinstance(conn.next_event(), CallFunc)
    two = conn.next_event_in(one + one)  # two requests in one read: the first now, the second buffered
    assert isinstance(two, CallFunc) and isinstance(conn.next_event(), CallFunc) and conn.drained()
    assert isinstance(conn.next_event_in(bytearray(one)), CallFunc)  # not bytes: the general path
    assert conn.next_event_in(b"") == ConnectionClosed(clean=True)
    bad = _server_after_handshake(hello)
    closed = bad.next_event_in(struct.pack("<q", 2) + b"\0\0")
    assert isinstance(closed, ConnectionClosed) and not closed.clean and "outside 4.." in closed.error
    strict = Connection(Role.SERVER)
    strict.receive_data(hello)
    strict.next_event()
    strict.accept()
    strict.receive_data(b"".join(bytes(p) for p in client.send_init_server([], PROTOCOL_VERSION)))
    strict.next_event()
    with pytest.raises(LocalProtocolError):  # the answer to the last request is still owed
        strict.next_event_in(one)
