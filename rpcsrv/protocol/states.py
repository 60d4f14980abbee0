"""The RPC connection's states and transitions, as data (like h11's ``_state.py``).

TVM's RPC is strictly request/answer after the handshake: the client sends one request, the server
answers it, and only then may the client send the next.  One side's state moves on what it sends and
what it receives; the table below lists every allowed (role, state, action) and where it leads.
Anything else is refused:

* a local call in the wrong state (an answer with no request, a second request before the answer,
  ``accept`` twice, ``next_event`` while the server owes an answer) raises :class:`LocalProtocolError`;
* a peer's packet in the wrong state (an answer the client never asked for, a request while the
  server is still answering) ends the connection (``ConnectionClosed`` with the reason).

Actions: ``hello`` (client's opening bytes), ``handshake`` (server: a key arrived), ``accept`` /
``refuse`` (server), ``accepted`` / ``refused`` (client: the server's reply), ``request`` (client
sends one, server receives one), ``answer`` (server sends one, client receives one), ``notice`` (an
exception the server sends unasked: a session timeout or shutdown), ``close`` (either side's end).
"""

from __future__ import annotations

import enum

from .events import (BadPacket, CallFunc, CallFuncEnd, ConnectionClosed, CopyAck, CopyFromRemote, CopyToRemote,
                          HandshakeDone, HandshakeRefused, HandshakeRequest, InitServer, RemoteError, Return, Shutdown,
                          Syscall)


class Role(enum.Enum):
    SERVER = "server"
    CLIENT = "client"

    __hash__ = object.__hash__  # identity hash in C: (role, state, action) keys are looked up per packet


class State(enum.Enum):
    HANDSHAKE = "handshake"  # nothing exchanged but the opening bytes
    AWAIT_ACCEPT = "await accept"  # (server) the client's key is in: accept() or refuse()
    IDLE = "idle"  # between requests
    ANSWERING = "answering"  # (server) a request is in: its answer is owed
    AWAITING = "awaiting"  # (client) a request is out: its answer is awaited
    CLOSED = "closed"

    __hash__ = object.__hash__


class LocalProtocolError(RuntimeError):
    """This side used the connection in a state where that is not allowed (a bug in the caller)."""


S, C = Role.SERVER, Role.CLIENT
_HELLO, _KEY, _IDLE, _CLOSED = State.HANDSHAKE, State.AWAIT_ACCEPT, State.IDLE, State.CLOSED  # (for the table)
#: each role's moves: state -> {action: the state it leads to}; every state a role uses may also "close"
MOVES = {
    S: {_HELLO: {"handshake": _KEY}, _KEY: {"accept": _IDLE, "refuse": _CLOSED},
        _IDLE: {"request": State.ANSWERING, "notice": _IDLE}, State.ANSWERING: {"answer": _IDLE, "notice": _IDLE},
        _CLOSED: {}},
    # the client's "notice": an exception the server sends unasked (timeout, shutdown)
    C: {_HELLO: {"hello": _HELLO, "accepted": _IDLE, "refused": _CLOSED},
        _IDLE: {"request": State.AWAITING, "notice": _IDLE}, State.AWAITING: {"answer": _IDLE}, _CLOSED: {}},
}
#: (role, state, action) -> the state it leads to: every allowed move, and nothing else
TRANSITIONS: dict[tuple[Role, State, str], State] = {
    (role, state, action): new for role, states in MOVES.items() for state, moves in states.items()
    for action, new in {**moves, "close": _CLOSED}.items()}


def advance(role: Role, state: State, action: str) -> State:
    """The state after ``action``; LocalProtocolError when the table does not allow it."""
    try:
        return TRANSITIONS[(role, state, action)]
    except KeyError:
        raise LocalProtocolError(f"a {role.value} cannot {action} in state {state.value!r}") from None


# what each received event means for the state machine (None: part of a request still arriving)
ALWAYS_TRACKED = frozenset({"hello", "handshake", "accept", "refuse", "accepted", "refused", "close"})
#: what arrives as a request, and as an answer (a side receiving the other side's kind ends the connection)
REQUESTS = (CallFunc, Syscall, InitServer, CopyToRemote, CopyFromRemote)
ANSWERS = (Return, RemoteError, CopyAck)
SERVER_RECEIVES = {HandshakeRequest: "handshake", CallFuncEnd: "request", BadPacket: "request", Shutdown: "close",
                   ConnectionClosed: "close", **dict.fromkeys(REQUESTS, "request"), **dict.fromkeys(ANSWERS, "answer")}
CLIENT_RECEIVES = {HandshakeDone: "accepted", HandshakeRefused: "refused", BadPacket: "answer", Shutdown: "close",
                   ConnectionClosed: "close", **dict.fromkeys(ANSWERS, "answer"), **dict.fromkeys(REQUESTS, "request")}
SENDS = {S: frozenset({"accept", "refuse", "answer", "notice", "close"}),
          C: frozenset({"hello", "request", "close"})}
TRANSITIONS_GET = TRANSITIONS.get

# ----------------------------------------------------------------------------- per-role dispatch
# The tables above, turned once into what a connection looks up per packet: for each state, a plain
# dict from what happens (an event type received, an action sent) to the next state, so checking a
# packet costs two dictionary lookups and no tuple.  Derived from TRANSITIONS; nothing new is said.

#: a received event that moves nothing (part of a request still arriving)
STAY = object()
#: a received event or a sent action the table does not allow here
REFUSED = None


def _receive_moves(role: Role, strict: bool) -> dict[State, dict[type, object]]:
    receives = SERVER_RECEIVES if role is S else CLIENT_RECEIVES
    out: dict[State, dict[type, object]] = {}
    for state in State:
        moves: dict[type, object] = {}
        for kind, action in receives.items():
            if not strict:  # a codec: follows the handshake, never refuses
                moves[kind] = TRANSITIONS_GET((role, state, action), state) if action in ALWAYS_TRACKED else STAY
                continue
            if action == "answer" and state is State.IDLE and kind is RemoteError:
                action = "notice"  # an exception the server sent unasked (timeout, shutdown)
            moves[kind] = TRANSITIONS_GET((role, state, action), REFUSED)
        out[state] = moves
    return out


def _send_moves(role: Role, strict: bool) -> dict[State, dict[str, State]]:
    actions = SENDS[role] if strict else ALWAYS_TRACKED
    return {state: {a: TRANSITIONS[(role, state, a)] for a in actions if (role, state, a) in TRANSITIONS}
            for state in State}


#: (role, strict) -> state -> received event type -> next state, STAY or REFUSED
RECEIVE_MOVES = {(role, strict): _receive_moves(role, strict) for role in Role for strict in (True, False)}
#: (role, strict) -> state -> sent action -> next state (absent: refused when strict, no move when not)
SEND_MOVES = {(role, strict): _send_moves(role, strict) for role in Role for strict in (True, False)}


def refusal(role: Role, state: State, action: str) -> LocalProtocolError:
    """Why ``role`` may not send ``action`` in ``state``."""
    if action not in SENDS[role]:
        return LocalProtocolError(f"a {role.value} does not send a {action}")
    return LocalProtocolError(f"a {role.value} cannot {action} in state {state.value!r}")
