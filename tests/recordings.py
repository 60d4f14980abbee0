"""Read the recorded real TVM sessions in ../shared/{classic,ffi}-sessions/.

Each recording is JSON lines of raw socket chunks per direction (or, for graph-executor.jsonl,
already-framed handshakes and packets).  ``streams`` joins each direction into one byte string;
``packets`` frames them into (direction, kind, bytes) with kind "handshake" or "packet" (the packet
bytes include their int64 length prefix).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rpcsrv.protocol import (CallFunc, Connection, CopyAck, CopyFromRemote, CopyToRemote, InitServer,
                             RemoteError, Return, Shutdown, Syscall)
from rpcsrv.protocol.codes import RPC_MAGIC


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def streams(path: Path) -> dict[str, bytes]:
    out = {"c2s": bytearray(), "s2c": bytearray()}
    for rec in load(path):
        if "hex" in rec:
            out[rec["dir"]] += bytes.fromhex(rec["hex"])
    return {k: bytes(v) for k, v in out.items()}


def _split(direction: str, data: bytes) -> list[tuple[str, bytes]]:
    """Frame one direction's stream: a handshake first, then length-prefixed packets."""
    items, pos = [], 0
    if direction == "c2s":
        (klen,) = struct.unpack_from("<i", data, 4)
        items.append(("handshake", data[:8 + klen]))
        pos = 8 + klen
    else:
        (code,) = struct.unpack_from("<i", data, 0)
        if code != RPC_MAGIC:
            return [("handshake", data[:4])]
        (klen,) = struct.unpack_from("<i", data, 4)
        items.append(("handshake", data[:8 + klen]))
        pos = 8 + klen
    while pos + 8 <= len(data):
        (n,) = struct.unpack_from("<q", data, pos)
        items.append(("packet", data[pos:pos + 8 + n]))
        pos += 8 + n
    return items


def packets(path: Path) -> list[tuple[str, str, bytes]]:
    """(direction, kind, bytes) in conversation order (request, answer, request, ...)."""
    recs = load(path)
    if recs and "kind" in recs[0]:  # pre-framed recording
        out = []
        for rec in recs:
            if "hex" in rec:
                out.append((rec["dir"], rec["kind"], bytes.fromhex(rec["hex"])))
            else:  # an elided packet: kind "elided", data = its first bytes
                out.append((rec["dir"], "elided", bytes.fromhex(rec["head_hex"])))
        return out
    s = streams(path)
    c2s, s2c = _split("c2s", s["c2s"]), _split("s2c", s["s2c"])
    out = []
    # the protocol is strictly request/answer; Shutdown (code 1) gets no answer
    i = j = 0
    while i < len(c2s):
        out.append(("c2s",) + c2s[i])
        is_shutdown = c2s[i][0] == "packet" and struct.unpack_from("<i", c2s[i][1], 8)[0] == 1
        i += 1
        if not is_shutdown and j < len(s2c):
            out.append(("s2c",) + s2c[j])
            j += 1
    return out


def reencode(conn: Connection, ev) -> bytes:
    """Rebuild the packet bytes of a decoded event with our encoder."""
    if isinstance(ev, InitServer):
        parts = conn.send_init_server(ev.args, ev.version)
    elif isinstance(ev, CallFunc):
        parts = conn.send_call(ev.handle, ev.args)
    elif isinstance(ev, Syscall):
        parts = conn.send_syscall(ev.code, ev.args)
    elif isinstance(ev, CopyToRemote):
        parts = conn.send_copy_to_remote(ev.tensor, ev.data)
    elif isinstance(ev, CopyFromRemote):
        parts = conn.send_copy_from_remote(ev.tensor, ev.nbytes)
    elif isinstance(ev, Return):
        parts = conn.send_return(ev.values)
    elif isinstance(ev, RemoteError):
        parts = conn.send_exception(ev.message)
    elif isinstance(ev, CopyAck):
        parts = conn.send_copy_ack(ev.data)
    elif isinstance(ev, Shutdown):
        parts = conn.send_shutdown()
    else:
        raise AssertionError(f"unexpected event {ev}")
    return b"".join(bytes(p) for p in parts)
