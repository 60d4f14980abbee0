"""What a session answers one request with (``Session.handle``); the server encodes it in the connection's
dialect (``server.encode``).  Apart from the session so that what only reads answers (the metrics,
``baton.py``) needs nothing of the session's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Answer:
    """What the session answers one request with; the server turns it into bytes."""


@dataclass(slots=True)
class Returned(Answer):
    """A value.  ``call``: a function's result (sent with its type code, ``EncodeReturn``); otherwise
    a syscall, init or copy answer (sent as the value alone)."""

    value: Any
    call: bool = False


@dataclass
class Failed(Answer):
    """An error, sent as an RPC exception with ``message``."""

    message: str


@dataclass
class CopyData(Answer):
    """The bytes of a kCopyFromRemote answer (sent from the tensor's memory, no copy)."""

    data: memoryview


#: the kInitServer answer (the connection sends it as zero values, which clients of both dialects accept)
INIT_DONE = Returned(None)


def message(exc: BaseException) -> str:
    """The text of an RPC exception for ``exc``: its message, named by its type unless it is the user's own
    mistake (``RPCUserError``) or a plain ``RuntimeError``."""
    text = str(exc) or type(exc).__name__
    name = type(exc).__name__
    if name in ("RPCUserError", "RuntimeError"):
        return text
    return f"{name}: {text}"

