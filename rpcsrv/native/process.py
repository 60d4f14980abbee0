"""Native worker processes: starting one with its configuration, and the warm spare the server keeps.

A worker is ``python -m rpcsrv.native.worker FD SESSION_ARENA_FD SIZE`` with one end of a socket pair.  Its
configuration is its *start message* (:class:`WorkerConfig`, the first message on the socket): the server's
settings (``rpcsrv.config.environment.snapshot``), the runtime shim and compiled kernels the server found or
built (so a worker never compiles, nor looks in a cache), the server's plugin choice, whether it confines itself, how
it computes.  It reads nothing else from its environment, which is scrubbed when it is confined
(``confine.worker_env``: only what must be set before Python starts).  It answers with its hello: ``("ready",
pid, arena size)`` and its own arena's descriptor.  Whatever goes wrong on the way, the process is killed and
reaped and every descriptor received or held is closed (:class:`WorkerProcess`).

:data:`SPARES` keeps one warm process (Python and numpy already started: about a second saved on a small
board) for the next session whose configuration it has, and starts the next in the background.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..config import environment
from ..executor.compute import ComputeSettings
from ..loader import plugins
from .confine import ConfineOptions, worker_env
from .confine_wire import loads
from .library import NativeError
from .wire import send

START_TIMEOUT = 30.0


@dataclass(frozen=True)
class WorkerConfig:
    """A worker's start message: everything it is configured with.

    * ``settings``: the server's values of rpcsrv's environment variables (``rpcsrv.config.environment``);
    * ``plugins``: the server's plugin choice (``rpcsrv.loader.plugins.choice``; None: it made none);
    * ``confine``: the worker imports what it needs, then refuses to run anything until its session has
      confined it (``confine.py``); ``confine_env``: the server's variables that pass (``--native-env``);
    * ``compute``: how it computes (its priority below the server's: ``RPCSRV_WORKER_NICE``);
    * ``shim``, ``kernels``: the runtime shim and the compiled executor kernels the server uses (files; None:
      it has none yet), which the worker loads and nothing else: a worker never compiles, and never looks
      in a cache (its home and environment are not the server's).  A worker started after the server's
      background build has finished gets what it built (``rpcsrv.native.builds``).

    A setting a later server option gives its workers is a field here, filled by :func:`worker_config`."""

    settings: dict[str, str] = field(default_factory=dict)
    plugins: Optional[dict] = None
    confine: bool = True
    confine_env: tuple[str, ...] = ()
    compute: ComputeSettings = ComputeSettings()
    shim: Optional[str] = None
    kernels: Optional[str] = None


def worker_config(confine: ConfineOptions) -> WorkerConfig:
    """The start message of a worker the server starts now, under its confinement options: with the shim and
    kernels the server has now (found or built by it: the worker neither compiles nor looks in a cache)."""
    from ..executor.kernels.clib import compiled
    from .shim import ShimUnavailable, shim_path

    try:
        shim: Optional[str] = str(shim_path())
    except (ShimUnavailable, OSError):
        shim = None  # the worker's load_module then names the symbols the library needed
    return WorkerConfig(environment.snapshot(), plugins.choice(), confine.enabled, tuple(confine.env),
                        ComputeSettings.from_environment("RPCSRV_WORKER_NICE"), shim, compiled.in_use_path())


class WorkerProcess:
    """A started worker: its process, the server's end of its socket pair, its pid and its arena's descriptor."""

    def __init__(self, config: WorkerConfig, arena: Any = None):
        self.config = config
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = [theirs.fileno()] + ([arena.fd] if arena else [])
        env = worker_env(os.environ, ConfineOptions(env=config.confine_env)) if config.confine else dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rpcsrv.native.worker", str(theirs.fileno()),
                 str(arena.fd if arena else -1), str(arena.capacity if arena else 0)],
                pass_fds=fds, env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.pid = 0
        self.arena_fd = -1  # the worker's own arena (mapped by the session: ``proxy.Worker``)
        self.arena_size = 0
        self._start()

    def _start(self) -> None:
        """Send the start message; take the hello.  On any failure: killed, reaped, descriptors closed."""
        fds: list[int] = []
        why = "failed to start"
        try:
            try:
                send(self.sock, self.config)
            except OSError:
                raise NativeError("the native worker failed to start (it closed its socket)") from None
            if not self.wait(time.monotonic() + START_TIMEOUT):
                why = "did not start"
                raise NativeError(f"the native worker did not start within {START_TIMEOUT:.0f}s")
            try:
                msg, fds, _flags, _addr = socket.recv_fds(self.sock, 8, 1)
                if len(msg) < 8 or not fds:
                    raise NativeError("the native worker failed to start")
                n = int.from_bytes(msg, "little")
                data = b""
                while len(data) < n:
                    chunk = self.sock.recv(n - len(data))
                    if not chunk:
                        raise NativeError("the native worker failed to start (it closed its socket)")
                    data += chunk
            except OSError as exc:  # (a worker that exits without reading its start message resets the socket)
                raise NativeError(f"the native worker failed to start ({exc.strerror or exc})") from None
            _ready, self.pid, self.arena_size = loads(data)  # a worker's word is checked (confine_wire.py)
            self.arena_fd = fds[0]
        except BaseException as exc:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.kill()
            if isinstance(exc, NativeError) and why == "failed to start":
                raise NativeError(f"{exc} ({self.exit_text()})") from None
            raise

    def wait(self, until: Optional[float]) -> bool:
        """Wait for the worker's next message until ``until`` (``time.monotonic()``; None: for ever)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            timeout = None if until is None else max(0, int((until - time.monotonic()) * 1000) + 1)
            if poller.poll(timeout):
                return True
            if until is not None and time.monotonic() >= until:
                return False

    def exit_text(self) -> str:
        """How the process ended (after a failure: its exit code or signal)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """End the process (reaped) and close its socket; the arena's descriptor is its owner's to close."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        self.sock.close()


class SparePool:
    """One warm worker process, started in the background after each one taken (:meth:`take`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spare: Optional[WorkerProcess] = None

    def take(self, config: WorkerConfig) -> Optional[WorkerProcess]:
        """The spare, if one is there, alive and started with ``config`` (a spare of other settings is
        stopped); a new spare starts in the background either way."""
        with self._lock:
            spare, self.spare = self.spare, None
        if spare is not None and (spare.config != config or not spare.running()):
            self._discard(spare)
            spare = None
        threading.Thread(target=self._refill, args=(config,), name="rpcsrv-spare-worker", daemon=True).start()
        return spare

    def _refill(self, config: WorkerConfig) -> None:
        try:
            process = WorkerProcess(config)
        except Exception:  # no spare this time; the next session starts its own
            return
        with self._lock:
            if self.spare is None:
                self.spare = process
                return
        self._discard(process)

    @staticmethod
    def _discard(process: WorkerProcess) -> None:
        process.kill()
        with contextlib.suppress(OSError):
            os.close(process.arena_fd)

    def close(self) -> None:
        """Stop the spare, after the one being started (a program that is not a server: ``rpcsrv check``)."""
        for thread in threading.enumerate():
            if thread.name == "rpcsrv-spare-worker":
                thread.join(30)
        with self._lock:
            spare, self.spare = self.spare, None
        if spare is not None:
            self._discard(spare)


#: the server's warm spare
SPARES = SparePool()
