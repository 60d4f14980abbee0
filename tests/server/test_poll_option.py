"""``--poll-us``: how long a session polls for the client's next request after each answer before it sleeps.

The default (300 us) keeps a core busy between close calls for a faster round trip; 0 sleeps at once, as
TVM's server does.  Checked by what the server process spends: a client that waits 2 ms between calls makes
a polling server spin its full poll time after every answer, and a server at 0 not at all."""

from __future__ import annotations

import os
import time

import pytest

from conftest import ServerProcess
from rpcsrv.client import rpc


def _cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (``schedstat``: nanoseconds, exact at each sleep)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def _server_cpu_per_call(poll_us: int, calls: int = 60, pause: float = 0.002) -> float:
    srv = ServerProcess("--poll-us", str(poll_us))
    try:
        remote = rpc.connect(srv.host, srv.port)
        f = remote.get_function("tvm.rpc.server.workpath")
        f("x")
        c0 = _cpu_seconds(srv.proc.pid)
        for _ in range(calls):
            time.sleep(pause)  # the client thinks longer than any poll: every poll runs its full time
            f("x")
        used = (_cpu_seconds(srv.proc.pid) - c0) / calls
        remote.close()
        return used
    finally:
        srv.stop()


def test_poll_time_is_what_the_server_spends_waiting():
    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        pytest.skip("needs Linux /proc")
    idle = _server_cpu_per_call(0)
    polling = _server_cpu_per_call(1000)
    assert polling > idle + 500e-6, f"server CPU per call: {polling * 1e6:.0f} us polling, {idle * 1e6:.0f} us not"
    assert idle < 500e-6, f"a server that sleeps at once still spent {idle * 1e6:.0f} us per call"


@pytest.mark.parametrize("value", ["-1", "1000001"])
def test_a_poll_time_out_of_range_is_refused(value):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", "--poll-us", value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--poll-us" in done.stderr, done.stderr[-1000:]
