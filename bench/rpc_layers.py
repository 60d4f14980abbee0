"""Where one small call's time goes on the server, layer by layer, from ``recv`` to ``send``.

    python bench/rpc_layers.py [--calls 20000] [--rounds 7]

The call is the one ``rpc_bench`` times (``tvm.rpc.server.workpath``), its bytes those the real
apache-tvm 0.27 client sent in ``../shared/ffi-sessions/globals.jsonl`` (the function handle swapped
for the one this session issued).  A real session (``Session``, ``Connection``, ``Transport`` over a
socket pair, inside trio) serves it the way ``board/server.py``'s loop does; the client's end of the
pair only writes the request before and reads the answer after the timed steps.  Layers:

* ``recv``: ``Transport.recv`` (the syscall, and the count of the bytes it read);
* ``parse``: framing the packet, its RPC code and function handle (the connection's reading minus the
  two layers below);
* ``state check``: the transition table (the connection's reading, strict minus non-strict);
* ``kinds decode``: the argument sequence through the dialect's kinds table (0 where the connection
  remembers a call it decoded by its bytes, as rpcsrv's does since issue 26: a repeated call is decoded
  once; ``parse`` then holds the lookup);
* ``session``: ``Session.handle`` (handle lookup, arguments, the function, its result to wire form);
* ``encode``: the answer's packet (``server.encode``);
* ``send``: ``Transport.send_all`` (the syscall, and the count of the bytes it wrote);
* ``syscalls alone``: a bare ``recv`` and ``send`` of the same bytes on the same sockets: what the
  two I/O layers cost beyond it is their bookkeeping (counting, joining, cancellation checks).

Each figure is the median over every call (``--rounds`` rounds of ``--calls`` calls), in nanoseconds
(the timer's own cost subtracted): a median per call, not per round, so that the calls another
process preempted (the machine is shared) do not count.  ``--src DIR`` imports rpcsrv from another checkout (an older
commit, for before/after figures from the same script).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT.parent / "shared" / "ffi-sessions" / "globals.jsonl"
LAYERS = ["recv", "parse", "state check", "kinds decode", "session", "encode", "send"]


def recorded_packets(path: Path = RECORDING) -> list[bytes]:
    """The client's packets (length prefix included) after its handshake, from a recording."""
    data = b"".join(bytes.fromhex(r["hex"]) for r in map(json.loads, path.read_text().splitlines())
                    if r.get("dir") == "c2s" and "hex" in r)
    pos = 8 + struct.unpack_from("<i", data, 4)[0]
    out = []
    while pos + 8 <= len(data):
        n = struct.unpack_from("<q", data, pos)[0]
        out.append(data[pos:pos + 8 + n])
        pos += 8 + n
    return out


def _timer_cost() -> float:
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(100000):
        clock()
    return (clock() - t0) / 100000


async def measure(calls: int, rounds: int) -> dict[str, float]:
    import trio

    from rpcsrv.board.server import encode
    from rpcsrv.board.session import Session
    from rpcsrv.board.globals import REGISTRY
    from rpcsrv.board.transport import Transport
    from rpcsrv.board.workspace import Workspace
    from rpcsrv.protocol import RPC_MAGIC, Connection, Dialect, Reader, Role, decode_packed_seq

    init, get_global, call = recorded_packets()[:3]
    out = {}
    a, b = socket.socketpair()
    a.setblocking(True)
    try:
        sock_b = trio.socket.from_stdlib_socket(b)
        io = Transport(sock_b)
        for strict in (True, False):
            conn = Connection(Role.SERVER, dialect=Dialect.FFI, strict=strict)
            conn.receive_data(struct.pack("<ii", RPC_MAGIC, 7) + b"client:")
            conn.next_event()
            conn.accept("")
            session = Session(conn, Workspace.create(None), REGISTRY)
            try:
                for pkt in (init, get_global):
                    conn.receive_data(pkt)
                    answer = await session.handle(conn.next_event())
                    parts = encode(conn, answer)
                handle = _handle_of(parts, Dialect.FFI)
                packet = call[:12] + struct.pack("<Q", handle) + call[20:]
                out[strict] = await _loop(io, a, conn, session, encode, packet, calls, rounds)
            finally:
                session.close()
        # the kinds decode alone, on the same argument bytes
        body = memoryview(packet[8:])
        clock = time.perf_counter_ns
        decode = []
        for _ in range(rounds * calls):
            t0 = clock()
            decode_packed_seq(Reader(body, 12), Dialect.FFI)
            decode.append(clock() - t0)
    finally:
        io.close()
        a.close()
        b.close()
    cost = _timer_cost()
    strict, loose = out[True], out[False]
    dec = statistics.median(decode) - cost
    # a connection that remembers decoded calls by their bytes (``protocol/parsing.py``, MEMO_CALLS) decodes
    # a repeated call's arguments once: on this path (the same call over and over) that layer is gone
    memo = hasattr(Connection(Role.SERVER), "_calls")
    res = {"recv": strict["recv"] - cost, "parse": loose["read"] - (0 if memo else dec) - cost,
           "state check": max(strict["read"] - loose["read"], 0.0), "kinds decode": 0.0 if memo else dec,
           "session": strict["session"] - cost, "encode": strict["encode"] - cost,
           "send": strict["send"] - cost, "syscalls alone": strict["bare"] - 2 * cost}
    res["server path"] = sum(res[k] for k in LAYERS)
    res["bookkeeping"] = res["server path"] - res["syscalls alone"]
    return res


def _handle_of(parts, dialect) -> int:
    """The handle a GetGlobalFunc answer carries."""
    from rpcsrv.protocol import decode_values
    return decode_values(b"".join(bytes(p) for p in parts)[12:], dialect)[-1].value


async def _loop(io, peer, conn, session, encode, packet: bytes, calls: int, rounds: int) -> dict:
    """Serve ``packet`` ``calls`` times per round; per-step medians over every call, in ns."""
    import trio

    clock = time.perf_counter_ns
    raw = io.sock
    steps = {k: [] for k in ("recv", "read", "session", "encode", "send", "bare")}
    whole = hasattr(conn, "next_event_in")  # (a baseline checkout may predate it)
    answer_len = None
    for _ in range(rounds):
        for _ in range(calls):
            peer.sendall(packet)
            await trio.lowlevel.wait_readable(raw)
            t0 = clock()
            data = await io.recv(1 << 16)
            t1 = clock()
            if whole:  # the server's path since stop 25: a request read whole, framed from the bytes as read
                ev = conn.next_event_in(data)
            else:
                conn.receive_data(data)
                ev = conn.next_event()
            t2 = clock()
            answer = await session.handle(ev)
            t3 = clock()
            parts = encode(conn, answer)
            t4 = clock()
            await io.send_all(parts)
            t5 = clock()
            if answer_len is None:
                answer_len = sum(len(p) for p in parts)
            got = 0
            while got < answer_len:
                got += len(peer.recv(1 << 16))
            # the same bytes through the bare socket, for the syscalls' own cost
            peer.sendall(packet)
            await trio.lowlevel.wait_readable(raw)
            joined = b"".join(bytes(p) for p in parts)
            t6 = clock()
            raw.recv(1 << 16)
            raw.send(joined)
            t7 = clock()
            got = 0
            while got < answer_len:
                got += len(peer.recv(1 << 16))
            for k, v in (("recv", t1 - t0), ("read", t2 - t1), ("session", t3 - t2), ("encode", t4 - t3),
                         ("send", t5 - t4), ("bare", t7 - t6)):
                steps[k].append(v)
        await trio.lowlevel.checkpoint()
    return {k: statistics.median(v) for k, v in steps.items()}


def breakdown(calls: int = 20000, rounds: int = 7) -> dict[str, float]:
    import trio
    return trio.run(measure, calls, rounds)


def report(res: dict[str, float], label: str = "") -> str:
    lines = [f"server path of one small call{f' ({label})' if label else ''}, ns per call:"]
    for k in LAYERS + ["server path", "syscalls alone", "bookkeeping"]:
        lines.append(f"  {k:16s}{res[k]:9.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--src", help="import rpcsrv from this checkout instead")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if args.src:
        sys.path.insert(0, args.src)
    res = breakdown(args.calls, args.rounds)
    print(json.dumps(res) if args.json else report(res, args.src or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
