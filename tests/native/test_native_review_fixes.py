"""Fixes from the end-of-stop reviews of the native layer: an arena closes its descriptor once (a second
close could hit a descriptor the number went to since); what a worker reports holding is believed only
within sense (never a credit against the budgets); a dead spare is closed and replaced; a worker that fails
its hello leaves no process or descriptor; and a busy worker ends when its server is gone."""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="arenas and workers are Linux's")


def test_an_arena_closes_its_descriptor_once():
    from rpcsrv.native.shm import Arena

    arena = Arena(1 << 16)
    number = arena.fd
    arena.close()
    other = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: most likely the arena's old one
    try:
        arena.close()  # again (a worker closed after it died, then the session's end)
        os.fstat(other)  # still open, whatever its number
    finally:
        os.close(other)
    assert arena.fd == -1 and number >= 0


def test_a_negative_or_garbled_held_report_is_no_credit():
    from rpcsrv.board.accounts import MemoryAccount
    from rpcsrv.native.proxy import Worker

    worker = Worker.__new__(Worker)  # only _settle's state: no process
    worker.account, worker.charged = MemoryAccount(1 << 20), 0
    worker._settle(("ok", None, 4096))
    assert worker.account.used == 4096 and worker.charged == 4096
    for report in (-(1 << 30), "lots", None):
        worker._settle(("ok", None, report))
        assert worker.account.used == 4096 and worker.charged == 4096
    worker._settle(("ok", None, 0))
    assert worker.account.used == 0


def test_a_dead_spare_worker_is_closed_and_replaced():
    """take_worker: a spare whose process died is closed (process reaped, descriptors closed), and the
    session gets a fresh worker that works."""
    import time

    from rpcsrv.native import process, proxy

    first = proxy.take_worker(None, lambda: None)  # starts a spare in the background
    try:
        for _ in range(300):
            if process.SPARES.spare is not None:
                break
            time.sleep(0.1)
        spare = process.SPARES.spare
        assert spare is not None, "no spare worker started"
        spare.proc.kill()
        spare.proc.wait(10)
        second = proxy.take_worker(None, lambda: None)
        try:
            assert second.process is not spare and second.alive and second.proc.poll() is None
            assert spare.sock.fileno() == -1  # closed, not left to the garbage collector
        finally:
            second.close()
    finally:
        first.close()


FAKE_WORKERS = {  # worker scripts that fail the hello at each step (argv[1]: the socket's descriptor)
    "closes at once": "import sys",
    "sends a descriptor, then closes": (
        "import os, socket, sys\n"
        "s = socket.socket(fileno=int(sys.argv[1]))\n"
        "fd = os.memfd_create('x')\n"
        "socket.send_fds(s, [(100).to_bytes(8, 'little')], [fd])\n"),
    "sends garbage": (
        "import os, socket, sys\n"
        "s = socket.socket(fileno=int(sys.argv[1]))\n"
        "fd = os.memfd_create('x')\n"
        "socket.send_fds(s, [(4).to_bytes(8, 'little')], [fd])\n"
        "s.sendall(b'junk')\n"),
}


@pytest.mark.parametrize("script", FAKE_WORKERS, ids=list(FAKE_WORKERS))
def test_a_worker_that_fails_its_hello_leaves_no_process_or_descriptor(script, monkeypatch):
    """Each way the start handshake can fail raises, reaps the process and closes every descriptor the
    server opened or received for it (before: a worker that closed after sending its arena left the
    process, the socket and the arena's descriptor open)."""
    import subprocess

    from rpcsrv.native import process, proxy

    real = subprocess.Popen
    started = []

    def fake(argv, **kw):
        started.append(real([sys.executable, "-c", FAKE_WORKERS[script], argv[3]], **kw))
        return started[-1]

    monkeypatch.setattr(process.subprocess, "Popen", fake)
    process.SPARES.close()  # (a spare an earlier test started would open descriptors meanwhile)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(Exception, match="failed to start|truncated|pickle|invalid load key"):
        proxy.Worker(None)
    assert started and started[0].returncode is not None  # reaped
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_worker_whose_server_is_gone_ends_even_inside_a_long_call():
    """A worker busy in a long native call (here: a sleep after ``watch_parent``) ends soon after the
    process that started it is gone, instead of running on as an orphan (an idle worker ends on its
    socket's EOF; a busy one never reads it)."""
    import subprocess
    import time

    grandchild = ("import time\nfrom rpcsrv.native.worker import watch_parent\nwatch_parent(0.1)\n"
                  "print('watching', flush=True)\ntime.sleep(60)\n")
    starter = ("import subprocess, sys\n"
               f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}], stdout=subprocess.PIPE, "
               "stderr=subprocess.DEVNULL)\n"
               "assert p.stdout.readline() == b'watching\\n'\n"
               "print(p.pid, flush=True)\n")  # and end, leaving it behind in its "native call"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    pid = int(subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, env=env,
                             timeout=60, check=True).stdout)

    def running() -> bool:
        try:
            with open(f"/proc/{pid}/status") as f:
                return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
        except FileNotFoundError:
            return False

    until = time.monotonic() + 20
    while running() and time.monotonic() < until:
        time.sleep(0.05)
    ended = not running()
    if not ended:
        os.kill(pid, 9)
    assert ended
