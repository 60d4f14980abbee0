"""The protocol's states as data (rpcsrv.protocol.states), driven through the public API only."""

from __future__ import annotations

import pytest

from rpcsrv.protocol import (NEED_DATA, CallFunc, Connection, ConnectionClosed, Dialect, HandshakeDone,
                             HandshakeRequest, InitServer, LocalProtocolError, RemoteError, Return, Role,
                             RPCCode, State, Syscall)
from rpcsrv.protocol.states import TRANSITIONS

F = Dialect.FFI


def pair():
    """A client and a server past the handshake and kInitServer, wired by hand."""
    client, server = Connection(Role.CLIENT, dialect=F), Connection(Role.SERVER, dialect=F)
    assert client.state is State.HANDSHAKE and server.state is State.HANDSHAKE
    server.receive_data(client.start("k"))
    assert isinstance(server.next_event(), HandshakeRequest) and server.state is State.AWAIT_ACCEPT
    assert server.next_event() is NEED_DATA  # nothing more until accept() or refuse()
    client.receive_data(server.accept("k"))
    assert server.state is State.IDLE
    assert isinstance(client.next_event(), HandshakeDone) and client.state is State.IDLE
    send(client, server, client.send_init_server())
    assert isinstance(server.next_event(), InitServer) and server.state is State.ANSWERING
    send(server, client, server.send_init_reply())
    assert isinstance(client.next_event(), Return)
    assert client.state is State.IDLE and server.state is State.IDLE
    return client, server


def send(src, dst, parts):
    dst.receive_data(b"".join(bytes(p) for p in parts))


def test_request_answer_cycle():
    client, server = pair()
    send(client, server, client.send_call(5, [1, "x"]))
    assert client.state is State.AWAITING
    assert isinstance(server.next_event(), CallFunc) and server.state is State.ANSWERING
    send(server, client, server.send_return([0, 7]))
    assert server.state is State.IDLE
    assert client.next_event() == Return([0, 7]) and client.state is State.IDLE


def test_local_misuse_raises():
    client, server = pair()
    with pytest.raises(LocalProtocolError):
        server.send_return([None])  # no request to answer
    with pytest.raises(LocalProtocolError):
        server.send_call(1, [])  # servers do not send requests
    with pytest.raises(LocalProtocolError):
        server.accept()  # the handshake is over
    with pytest.raises(LocalProtocolError):
        client.send_return([None])  # clients do not answer
    send(client, server, client.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["f"]))
    with pytest.raises(LocalProtocolError):
        client.send_call(1, [])  # a second request before the answer
    assert isinstance(server.next_event(), Syscall)
    with pytest.raises(LocalProtocolError):
        server.next_event()  # the answer is owed first
    send(server, client, server.send_exception("no"))
    assert client.next_event() == RemoteError("no") and client.state is State.IDLE


def test_peer_misbehaviour_ends_the_connection():
    client, server = pair()
    server.receive_data(b"".join(bytes(p) for p in Connection(Role.SERVER, strict=False, dialect=F)
                                 .send_return([1])))  # a "client" that sends an answer
    ev = server.next_event()
    assert isinstance(ev, ConnectionClosed) and "Return" in ev.error and server.state is State.CLOSED
    stray = Connection(Role.SERVER, strict=False, dialect=F).send_return([1])
    send(None, client, stray)  # an answer nobody asked for
    ev = client.next_event()
    assert isinstance(ev, ConnectionClosed) and client.state is State.CLOSED


def test_server_notice_is_allowed_while_idle():
    client, server = pair()
    send(server, client, server.send_exception("RPCSessionTimeoutError: expired"))
    assert server.state is State.IDLE
    assert isinstance(client.next_event(), RemoteError) and client.state is State.IDLE


def test_shutdown_and_refusal_close():
    client, server = pair()
    send(client, server, client.send_shutdown())
    assert client.state is State.CLOSED
    server.next_event()
    assert server.state is State.CLOSED
    c2, s2 = Connection(Role.CLIENT), Connection(Role.SERVER)
    s2.receive_data(c2.start("wrong"))
    s2.next_event()
    c2.receive_data(s2.refuse())
    assert s2.state is State.CLOSED
    c2.next_event()
    assert c2.state is State.CLOSED


def test_every_transition_is_reachable_from_the_start():
    """The table has no dead entries: each (role, state) it names can be reached."""
    for role in Role:
        reached, frontier = {State.HANDSHAKE}, [State.HANDSHAKE]
        while frontier:
            here = frontier.pop()
            for (r, state, _), to in TRANSITIONS.items():
                if r is role and state is here and to not in reached:
                    reached.add(to)
                    frontier.append(to)
        named = {state for (r, state, _) in TRANSITIONS if r is role}
        assert named - {State.CLOSED} <= reached, role
