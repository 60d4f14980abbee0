"""Container health: a real TVM RPC handshake with the board on localhost.

Sends the client handshake with the board's key and, when accepted, kInitServer, waits for its
answer and shuts the session down: the listener, the protocol loop and a session's set-up all work.
A board registered with a tracker accepts only the match keys the tracker hands out, so there a
well-formed refusal (RPC_CODE_MISMATCH) also counts as healthy: the board answered the handshake.
Exit status 0 = healthy.  Environment: RPCSRV_PORT (9090), RPCSRV_KEY (""), RPCSRV_HEALTH_TIMEOUT (4 s).
"""

from __future__ import annotations

import os
import socket
import sys

from rpcsrv.protocol import NEED_DATA, Connection, HandshakeDone, HandshakeRefused, Return, Role
from rpcsrv.protocol.codes import RPC_CODE_MISMATCH


def check(host: str, port: int, key: str, timeout: float) -> str:
    conn = Connection(Role.CLIENT)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(conn.start(key))

        def next_event():
            while True:
                ev = conn.next_event()
                if ev is not NEED_DATA:
                    return ev
                conn.receive_data(sock.recv(1 << 16))

        ev = next_event()
        if isinstance(ev, HandshakeRefused) and ev.code == RPC_CODE_MISMATCH:
            return "handshake answered (key refused: tracker match keys only)"
        if not isinstance(ev, HandshakeDone):
            raise RuntimeError(f"unexpected handshake answer {ev!r}")
        sock.sendall(b"".join(bytes(p) for p in conn.send_init_server()))
        ev = next_event()
        if not isinstance(ev, Return):
            raise RuntimeError(f"unexpected answer to kInitServer: {ev!r}")
        sock.sendall(b"".join(bytes(p) for p in conn.send_shutdown()))
        return f"session opened ({ev.__class__.__name__} to kInitServer)"


def main() -> int:
    try:
        print(check("127.0.0.1", int(os.environ.get("RPCSRV_PORT", "9090")), os.environ.get("RPCSRV_KEY", ""),
                    float(os.environ.get("RPCSRV_HEALTH_TIMEOUT", "4"))))
        return 0
    except (OSError, RuntimeError) as exc:
        print(f"unhealthy: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
