"""Test helpers for farm scenarios: TVM's real tracker and proxy as child processes, boards, ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from conftest import REPO

sys.path.insert(0, str(REPO / "deploy"))

import hil_runner  # noqa: E402  (the runner the Docker and netns scenarios use)

__all__ = ["hil_runner", "free_port", "TvmService", "wait_port", "wait_until"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


def wait_until(predicate, timeout: float, step: float = 0.1):
    """Poll ``predicate`` until it returns a true value (returned) or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


class TvmService:
    """``python -m tvm.exec.rpc_tracker`` or ``rpc_proxy`` on a loopback port, as a user starts them.

    TVM runs the service in a ``tvm.exec.popen_worker`` child (~200 MB) that outlives a killed parent,
    so the service gets a process group of its own and :meth:`stop` kills the whole group."""

    def __init__(self, kind: str, port: int | None = None, *extra: str, host: str = "127.0.0.1"):
        self.kind = kind
        self.host = host
        self.port = port or free_port()
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"tvm.exec.rpc_{kind}", "--host", host, "--port", str(self.port),
             "--port-end", str(self.port + 1), *extra], stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            wait_port(host, self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"TVM {kind} did not start: {self.output()}") from None

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        """The service and every process it started (its popen_worker), then the leader reaped."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is gone already
        self.proc.wait(10)
