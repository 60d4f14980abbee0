"""The codec against real bytes: every packet of the recorded TVM sessions decodes, in the dialect the
recording was made with, and re-encodes to exactly the recorded bytes."""

from __future__ import annotations

import struct

import pytest

from conftest import need_shared
from recordings import packets, reencode
from rpcsrv.protocol import (NEED_DATA, BadPacket, Connection, ConnectionClosed, Dialect, HandshakeDone,
                             HandshakeRequest, Role, encode_values)
from rpcsrv.protocol.codec import Writer, encode_packed_seq

CASES = [("classic-sessions", n, Dialect.CLASSIC) for n in
         ("globals", "tensors", "files", "keyed", "graph-executor")] + \
        [("ffi-sessions", n, Dialect.FFI) for n in ("globals", "tensors", "files")]


@pytest.mark.parametrize("folder,name,dialect", CASES, ids=[f"{f[:3]}-{n}" for f, n, _ in CASES])
def test_recorded_packets_roundtrip_byte_exact(folder, name, dialect):
    path = need_shared(folder, f"{name}.jsonl")
    server_side = Connection(Role.SERVER, strict=False)  # auto-detects the client's dialect
    client_side = Connection(Role.CLIENT, strict=False, dialect=dialect)
    checked = 0
    for direction, kind, data in packets(path):
        if kind == "elided":  # the upload in graph-executor.jsonl
            continue
        conn = server_side if direction == "c2s" else client_side
        conn.receive_data(data)
        ev = conn.next_event()
        assert ev is not NEED_DATA and not isinstance(ev, (BadPacket, ConnectionClosed)), ev
        if kind == "handshake":
            assert isinstance(ev, (HandshakeRequest, HandshakeDone))
            if isinstance(ev, HandshakeRequest):
                server_side.accept()
            continue
        assert conn.next_event() is NEED_DATA
        assert reencode(conn, ev) == data, f"{direction} {type(ev).__name__} re-encodes differently"
        checked += 1
    assert server_side.dialect is dialect
    assert checked >= 4


def test_wrong_key_recording_is_a_mismatch_answer():
    path = need_shared("classic-sessions", "wrong-key.jsonl")
    items = packets(path)
    (_, _, hello), (_, _, answer) = items[0], items[1]
    conn = Connection(Role.SERVER, strict=False)
    conn.receive_data(hello)
    ev = conn.next_event()
    assert isinstance(ev, HandshakeRequest) and ev.key == "board-b"
    assert conn.refuse() == answer


def test_exception_packet_matches_tvm_layout():
    # rpc_reference.h ReturnException: code 5, num_args 1, string type, uint64 length, bytes
    for dialect, tcode in ((Dialect.CLASSIC, 11), (Dialect.FFI, 8)):
        conn = Connection(Role.SERVER, strict=False, dialect=dialect)
        got = b"".join(conn.send_exception("boom"))
        body = struct.pack("<iiiQ", 5, 1, tcode, 4) + b"boom"
        assert got == struct.pack("<q", len(body)) + body


def test_packed_seq_writer_matches_encode_values():
    w = Writer()
    encode_packed_seq(w, [1, "x"], Dialect.FFI)
    assert b"".join(w.finish()) == encode_values([1, "x"], Dialect.FFI)
