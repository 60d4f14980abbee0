"""What a board is told to do: one immutable object, made once (``rpcsrv serve``'s flags) and handed down.

:class:`ServeOptions` is everything ``rpcsrv serve`` is told: where to listen, the key, the limits, how native
code runs and is confined, how the server computes, the metrics endpoint.  The server holds it
(``server.Server.options``) beside its live state, and passes the part each piece needs: the limits to
connections and sessions, the native options to each session's policy (``rpcsrv.native.host``), which puts
what a worker needs in the worker's start message (``rpcsrv.native.process``).  Nothing reads a flag from a
module global or the environment.

A new option is a field here (with its default), a flag in ``rpcsrv/cli.py`` that fills it, and a read where
it acts: ``Server`` holds the options, so the code that serves (``server.py``) and each session see it with
no new plumbing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config.toolchain import BuildSettings
from ..executor.compute import ComputeSettings
from ..native.confine import ConfineOptions
from ..protocol import Dialect
from .limits import Limits
from .transport import SPIN_SECONDS


@dataclass(frozen=True)
class NativeOptions:
    """How native host code in uploaded libraries runs (``--native``, ``--isolate``, ``--native-confine/-user/
    -env``): ``mode`` isolated (a worker process per session), inprocess or off; ``isolate``: which libraries
    load in the session's worker, native (those whose native code runs), all, or auto (all while another
    session computes in the server); ``confine``: how the workers are confined."""

    mode: str = "isolated"
    isolate: str = "auto"
    confine: ConfineOptions = ConfineOptions()


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``rpcsrv serve`` is told (each field is its flag's; defaults are the flags')."""

    host: str = "127.0.0.1"
    port: int = 9090
    port_end: Optional[int] = None
    key: str = ""
    workdir: Optional[Path] = None
    dialect: Optional[Dialect] = None  # None: detect per connection
    limits: Limits = field(default_factory=Limits)
    native: NativeOptions = NativeOptions()
    poll_us: int = round(SPIN_SECONDS * 1e6)  # how long a session polls for the next request (transport.py)
    #: how the server computes: its computing threads' priority below the event loop's, pinned BLAS threads,
    #: jobs per interpreter (``rpcsrv.executor.compute``; the CLI reads their environment variables)
    compute: ComputeSettings = ComputeSettings()
    metrics_port: Optional[int] = None  # /metrics, the status page and /healthz (rpcsrv.board.observe)
    metrics_host: Optional[str] = None
    #: where the board caches the shim and kernels it builds, and whether it builds them (``--cache-dir``,
    #: ``--build``): in the background from the start (``rpcsrv.native.builds``); None: the process's own
    #: way (a server embedded in another program: built at first use)
    build: Optional[BuildSettings] = None
    #: seconds between self-tests while no session is open (``rpcsrv.board.health``); None: no self-test
    health_interval: Optional[float] = None
    #: seconds one request to a session's worker may take (a native call, a graph run); past it the worker is
    #: killed and the session ends (``rpcsrv.native.proxy``); None: only the session's own timeout
    call_timeout: Optional[float] = None
