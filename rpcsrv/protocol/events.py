"""Events a :class:`~rpcsrv.protocol.connection.Connection` produces from the peer's bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .codes import RPCCode
from .values import TensorHeader


class Event:
    """Base class of everything :meth:`Connection.next_event` returns."""


class NeedData(Event):
    """Nothing complete yet: feed more bytes."""


NEED_DATA = NeedData()


@dataclass
class HandshakeRequest(Event):
    """(server) A client presented its key, e.g. ``"client:board-a -timeout=10"``."""

    header: str

    @property
    def key(self) -> Optional[str]:
        """The key after ``client:`` (None when the header is not a client header)."""
        first = self.header.split()[0] if self.header.split() else ""
        return first[len("client:"):] if first.startswith("client:") else None

    @property
    def options(self) -> dict[str, str]:
        """Options after the key (``-timeout=10`` → ``{"timeout": "10"}``)."""
        opts = {}
        for word in self.header.split()[1:]:
            if word.startswith("-") and "=" in word:
                k, v = word[1:].split("=", 1)
                opts[k] = v
        return opts


@dataclass
class HandshakeDone(Event):
    """(client) The server accepted; ``server_key`` is its ``"server:<key>"`` header."""

    server_key: str


@dataclass
class HandshakeRefused(Event):
    """(client) The server answered a code other than success (e.g. key mismatch)."""

    code: int


@dataclass
class InitServer(Event):
    version: str
    args: list


@dataclass
class CallFunc(Event):
    handle: int
    args: list


@dataclass
class Syscall(Event):
    code: RPCCode
    args: list


@dataclass
class CopyToRemote(Event):
    """Data for a remote tensor.  ``in_place``: the data was already received into the target the
    session named in answer to :class:`CopyToRemoteStart` (``data`` is that target)."""

    tensor: TensorHeader
    nbytes: int
    data: memoryview
    in_place: bool = False


@dataclass
class CopyToRemoteStart(Event):
    """(server) A large kCopyToRemote is arriving: call ``Connection.set_copy_target`` with the
    destination memory (or None and an error) so the body lands there without intermediate copies."""

    tensor: TensorHeader
    nbytes: int


@dataclass
class CallFuncStart(Event):
    """(server) A large kCallFunc whose last argument is ``nbytes`` of bytes is arriving (an upload).

    Answer with ``Connection.stream_call(True)`` to receive those bytes as :class:`CallFuncChunk`
    events and then :class:`CallFuncEnd` (memory stays bounded whatever the size), or
    ``stream_call(False)`` to receive the whole call as one :class:`CallFunc` as usual."""

    handle: int
    args: list
    nbytes: int


@dataclass
class CallFuncChunk(Event):
    """(server) The next piece of a streamed call's trailing bytes; ``data`` is valid until the
    next call into the connection."""

    data: memoryview


@dataclass
class CallFuncEnd(Event):
    """(server) All trailing bytes of the streamed call have arrived; the peer awaits the answer."""

    handle: int


@dataclass
class CopyFromRemote(Event):
    tensor: TensorHeader
    nbytes: int


@dataclass
class Return(Event):
    values: list


@dataclass
class RemoteError(Event):
    """(client) The server answered kException."""

    message: str


@dataclass
class CopyAck(Event):
    data: memoryview


@dataclass
class Shutdown(Event):
    pass


@dataclass
class BadPacket(Event):
    """A well-framed packet whose content is wrong; the peer expects an answer (an exception)."""

    code: int
    error: str


@dataclass
class ConnectionClosed(Event):
    """The peer closed (``clean``: at a packet boundary) or the stream is beyond repair."""

    clean: bool = True
    error: str = ""
