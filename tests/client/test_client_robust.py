"""The client never sends from ``__del__`` (a collection may run mid-request) and turns every
unexpected answer into an RPCError (issue 11)."""

from __future__ import annotations

import gc
import socket
import struct
import threading

import pytest

from rpcsrv.client import rpc
from rpcsrv.protocol import NEED_DATA, Connection, HandshakeRequest, InitServer, Role


def test_garbage_collection_sends_nothing_and_frees_on_the_next_call(server):
    with rpc.connect(server.host, server.port) as sess:
        stats = sess.get_function("rpcsrv.session_stats")
        buffers = lambda: int(stats().split(",")[1].split("=")[1])  # noqa: E731
        start = buffers()
        sent = []
        real_send = sess._send
        sess._send = lambda parts, progress=None: (sent.append(1), real_send(parts, progress))
        arr = sess.empty((16,), "float32")
        sent.clear()
        del arr
        gc.collect()
        assert sent == []  # nothing went out from __del__
        assert buffers() == start  # the free went first, then this call
        assert len(sent) == 2


def test_free_queued_during_a_request_does_not_interleave(server):
    """A collection inside a request (here: __del__ run by hand between send and receive) must not
    write a packet into the middle of it."""
    with rpc.connect(server.host, server.port) as sess:
        f = sess.get_function("tvm.rpc.server.workpath")
        arr = sess.empty((4,), "float32")
        real_recv = sess._recv_event

        def recv_with_gc():
            arr.__del__()  # what a collection at this moment would do
            return real_recv()

        sess._recv_event = recv_with_gc
        assert f("x").endswith("x")
        sess._recv_event = real_recv
        assert f("y").endswith("y")  # the queued free went out first, answers stayed in order


def fake_server(answer: bytes):
    """A server that accepts one handshake and kInitServer, then answers every request with ``answer``."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def run():
        s, _ = lsock.accept()
        conn = Connection(Role.SERVER, strict=False)
        with s:
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA:
                    try:
                        data = s.recv(65536)
                    except OSError:
                        return
                    conn.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(ev, HandshakeRequest):
                    s.sendall(conn.accept())
                elif isinstance(ev, InitServer):
                    s.sendall(b"".join(conn.send_init_reply()))
                else:
                    s.sendall(answer)
                    if not answer:
                        return
    threading.Thread(target=run, daemon=True).start()
    return lsock.getsockname()[1]


def _packet(code: int, body: bytes = b"") -> bytes:
    return struct.pack("<qi", 4 + len(body), code) + body


@pytest.mark.parametrize("answer,match", [
    (_packet(8, b"\x00" * 16), "unexpected answer.*CopyAck"),  # a CopyAck to a call
    (_packet(4, struct.pack("<iiqiq", 2, 1, 68, 1, 5)), "bad return value"),  # a function "handle" that is an int
    (_packet(4, struct.pack("<i", 7)), "bad answer"),  # num_args 7 with no values
    (_packet(99), "bad answer"),  # unknown RPC code
    (struct.pack("<q", -5), "connection closed|bad answer"),  # a broken length
])
def test_unexpected_answers_are_rpc_errors(answer, match):
    port = fake_server(answer)
    sess = rpc.connect("127.0.0.1", port)
    with pytest.raises(rpc.RPCError, match=match):
        rpc.RemoteFunction(sess, 1)()
    sess.close()
