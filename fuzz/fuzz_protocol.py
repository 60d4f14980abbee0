"""atheris target: the sans-IO protocol decoder (both dialects, both roles).

    python fuzz/fuzz_protocol.py -max_total_time=3600 -timeout=5

Input: the bytes a peer sends after the handshake (a valid handshake is prepended, so the fuzzer
works on packets).  The first byte picks the role, the dialect, and how large announced bodies are
answered (streamed or whole, copy target named or refused).  Anything but an event, NEED_DATA or
ConnectionClosed (e.g. an IndexError or struct.error escaping the decoder) is a crash; the packed
sequence decoder is also run on the raw bytes in both dialects (ProtocolError is the only
allowed failure).
"""

from __future__ import annotations

import struct

from common import run

from rpcsrv.protocol import (NEED_DATA, CallFuncStart, Connection, ConnectionClosed, CopyToRemoteStart,
                             Dialect, HandshakeDone, HandshakeRequest, ProtocolError, Role, decode_values)
from rpcsrv.protocol.codes import RPC_CODE_SUCCESS, RPC_MAGIC

MAX_EVENTS = 1000


def test_one(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0], data[1:]
    role = Role.SERVER if mode & 1 else Role.CLIENT
    dialect = (None, Dialect.CLASSIC, Dialect.FFI, Dialect.FFI)[(mode >> 1) & 3]
    if role is Role.CLIENT and dialect is None:
        dialect = Dialect.FFI
    conn = Connection(role, dialect=dialect, strict=bool(mode & 64))
    if role is Role.SERVER:
        conn.receive_data(struct.pack("<ii", RPC_MAGIC, 7) + b"client:")
        assert isinstance(conn.next_event(), HandshakeRequest)
        conn.accept()
    else:
        conn.start()
        conn.receive_data(struct.pack("<ii", RPC_CODE_SUCCESS, 7) + b"server:")
        assert isinstance(conn.next_event(), HandshakeDone)
        if conn.strict:
            conn.send_call(1, [])
    conn.receive_data(body)
    conn.receive_data(b"")
    for _ in range(MAX_EVENTS):
        try:
            ev = conn.next_event()
        except Exception as exc:  # only a strict server owing an answer may raise
            if type(exc).__name__ != "LocalProtocolError":
                raise
            conn.send_exception("answered")
            continue
        if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
            break
        if isinstance(ev, CopyToRemoteStart):
            target = memoryview(bytearray(ev.nbytes)) if mode & 8 and ev.nbytes < (1 << 24) else None
            conn.set_copy_target(target, "refused by the fuzzer")
        elif isinstance(ev, CallFuncStart):
            conn.stream_call(bool(mode & 16))
    else:
        raise AssertionError("the connection produced events without end")
    for d in Dialect:
        try:
            decode_values(body, d)
        except ProtocolError:
            pass


def seeds():
    import sys
    from pathlib import Path

    from recordings import streams

    data = Path(__file__).resolve().parent.parent / "tests" / "data"
    for path in sorted(data.glob("*-sessions/*.jsonl")):
        s = streams(path)
        c2s, s2c = s["c2s"], s["s2c"]
        if len(c2s) < 8 or len(s2c) < 8:
            continue
        klen = struct.unpack_from("<i", c2s, 4)[0]
        dialect_bits = 2 if "classic" in str(path) else 4
        yield bytes([1 | dialect_bits | 8 | 16]) + c2s[8 + klen:]
        slen = struct.unpack_from("<i", s2c, 4)[0]
        yield bytes([dialect_bits]) + s2c[8 + slen:]
    del sys


if __name__ == "__main__":
    run("protocol", test_one, seeds())
