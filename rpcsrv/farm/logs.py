"""How ``rpcsrv serve`` logs: plain lines, or one JSON object per line (``--log-json``).

The session records themselves come from :mod:`rpcsrv.board.records`; this module only formats them
(with ``--log-json`` a session record's fields become keys of its JSON object).
"""

from __future__ import annotations

import json
import logging
import time


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (+ the session fields, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "session", None)
        if isinstance(fields, dict):
            out["event"] = "session"
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure(verbose: bool, json_lines: bool) -> None:
    """Root logging for ``rpcsrv serve``: warnings (all with -v), session lines always, UTC times."""
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.formatter.converter = time.gmtime
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    for name in ("rpcsrv.sessions", "rpcsrv.tracker", "rpcsrv.proxy"):
        logging.getLogger(name).setLevel(logging.INFO)
