"""One log record per session, fit for a farm of boards (formatting: :mod:`rpcsrv.farm.logs`).

Every session ends with one record on the ``rpcsrv.sessions`` logger (INFO, shown by default)::

    session peer=10.0.0.2:51234 key=board-x duration=1.204s bytes_in=41873 bytes_out=9120 calls=37 errors=0 end=closed

``end`` is ``closed`` (the client closed or shut down), ``timeout`` (the handshake's ``-timeout=``), ``idle``
(``--idle-timeout``),
``shutdown`` (SIGTERM) or ``lost`` (the connection broke).  With ``--log-json`` each log line is one
JSON object, and a session record carries those fields as keys.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

from .transport import Transport

session_log = logging.getLogger("rpcsrv.sessions")


@dataclass
class SessionRecord:
    peer: str
    key: str
    start: float
    io: Optional[Transport] = None
    calls: int = 0
    end: str = "closed"

    def fields(self, errors: int) -> dict[str, Any]:
        return {"peer": self.peer, "key": self.key, "duration": round(time.monotonic() - self.start, 3),
                "bytes_in": self.io.bytes_in if self.io else 0, "bytes_out": self.io.bytes_out if self.io else 0,
                "calls": self.calls, "errors": errors, "end": self.end}

    def finish(self, session: Any) -> dict[str, Any]:
        """Log the session's line; returns its fields."""
        f = self.fields(getattr(session, "errors", 0))
        text = " ".join(f"{k}={v}" + ("s" if k == "duration" else "") for k, v in f.items())
        session_log.info("session %s", text, extra={"session": f})
        return f
