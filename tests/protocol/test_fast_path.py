"""The small-call path's shortcuts say nothing new: each is checked against the general path it
stands for (issue 26).

* a plain value's return packet, made from a head fixed per dialect and type, is byte for byte what
  encoding ``pack_return``'s sequence gives, and the client reads the value back;
* the per-role, per-state dispatch dicts are the transition table, entry for entry;
* a call's code and handle read in one unpack, and the dialect's ``decode_seq``, agree with the
  general reader, also on short, truncated and unknown input.
"""

from __future__ import annotations

import struct

import pytest

from rpcsrv.protocol import (BadPacket, CallFunc, Connection, DataType, Device, Dialect, FunctionHandle, Reader,
                             Return, Role, RPCCode, State, TensorHeader, decode_values, encode_values, pack_return,
                             unpack_return)
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
