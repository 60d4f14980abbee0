"""Server lifecycle: port ranges, concurrent sessions, session timeouts, clean Ctrl-C shutdown."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from rpcsrv.client import rpc
from conftest import ServerProcess


@pytest.mark.parametrize("sig, ignored_by_parent", [
    (signal.SIGINT, False),   # Ctrl-C
    (signal.SIGTERM, False),  # docker stop, systemd, kill
    (signal.SIGINT, True),    # `rpcsrv serve &` in a shell without job control starts with SIGINT ignored
])
def test_signals_shut_down_cleanly_and_remove_workspaces(tmp_path, sig, ignored_by_parent):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignored_by_parent else None
    try:
        srv = ServerProcess(workdir=tmp_path)  # the child inherits the ignored SIGINT
    finally:
        if ignored_by_parent:
            signal.signal(signal.SIGINT, previous)
    s = rpc.connect(srv.host, srv.port)
    s.upload(b"data", "f.bin")
    assert len(list(tmp_path.iterdir())) == 1  # the session's workspace
    srv.proc.send_signal(sig)
    assert srv.proc.wait(15) == 0
    assert list(tmp_path.iterdir()) == []
    assert "rpcsrv: stopped" in srv.stderr()


def test_session_end_removes_its_workspace(server, tmp_path):
    s = rpc.connect(server.host, server.port)
    ws = s.get_function("tvm.rpc.server.workpath")(".")
    s.upload(b"data", "f.bin")
    s.close()
    import os
    import time

    for _ in range(50):
        if not os.path.exists(ws):
            break
        time.sleep(0.05)
    assert not os.path.exists(ws)


def test_port_range_skips_busy_ports(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    proc = None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rpcsrv", "serve", "--port", str(port),
                                 "--port-end", str(port + 20), "--workdir", str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        got = int(line.rsplit(":", 1)[1].split()[0])
        assert port < got < port + 20
        s = rpc.connect("127.0.0.1", got)
        assert s.get_function("tvm.rpc.server.workpath")("x")
        s.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
    finally:
        busy.close()
        if proc is not None and proc.poll() is None:
            proc.kill()


def test_concurrent_sessions_are_isolated(server):
    errors = []

    def worker(i: int) -> None:
        try:
            with rpc.connect(server.host, server.port) as s:
                x = np.full((64, 64), i, dtype="int32")
                a = s.array(x)
                s.upload(bytes([i]) * 100, "mine.bin")
                for _ in range(20):
                    np.testing.assert_array_equal(a.numpy(), x)
                assert s.download("mine.bin") == bytes([i]) * 100
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_session_timeout_option(server):
    s = rpc.connect(server.host, server.port, session_timeout=0.5)
    import time

    time.sleep(1.0)
    with pytest.raises(rpc.RPCError, match="RPCSessionTimeoutError|closed"):
        s.get_function("tvm.rpc.server.workpath")("x")
