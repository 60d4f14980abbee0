"""The pieces under ``--health-interval`` and ``--call-timeout``, without a tracker (the farm scenarios with TVM's
own tracker and client are in tests/deploy/test_health_watchdog.py):

* ``Health``: the verdict, its counts, watchers told only when it changes;
* ``run_health``: the test waits while a session is open, a test that raises is a failed test;
* the watchdog in ``proxy.Worker``: a request past the call timeout kills the worker and raises ``CallTimeout``;
  the session's deadline, when it comes first, keeps its own error; the worker's memory goes back to the account.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from conftest import REPO, need_program
from rpcsrv.board.accounts import MemoryAccount
from rpcsrv.board.health import Health, run_health

SPIN_C = r"""
#include "tvm_c_abi.h"
void* __tvm_module_ctx = 0;
/* loops while A[0] >= 0 (A: a float32 tensor): returns at once for a negative A[0] */
TVM_DLL int32_t spin(void* args, int32_t* codes, int32_t n, void* ret, int32_t* ret_code, void* res) {
  (void)codes; (void)n; (void)ret; (void)ret_code; (void)res;
  DLTensor* t = (DLTensor*)((TVMValue*)args)[0].v_handle;
  volatile float* a = (volatile float*)t->data;
  while (a[0] >= 0) {}
  return 0;
}
"""


def test_health_counts_and_tells_watchers_only_on_a_change():
    health, seen = Health(), []
    health.watch(lambda ok, reason: seen.append((ok, reason)))
    assert health.ok and health.checks == {"ok": 0, "failed": 0}
    health.record([])
    health.record(["native smoke run: no shim", "examplejson smoke run: wrong result"])
    health.record(["native smoke run: no shim"])
    assert not health.ok and health.reason == "native smoke run: no shim"
    assert health.last_failure_reason == "native smoke run: no shim" and health.last_failure > time.time() - 60
    health.record([])
    assert health.ok and health.reason == "" and health.checks == {"ok": 2, "failed": 2}
    assert seen == [(False, "native smoke run: no shim; examplejson smoke run: wrong result"), (True, "")]
    assert health.last_failure_reason == "native smoke run: no shim"  # kept after it passes again


def test_run_health_waits_for_a_free_board_and_counts_a_raising_test_as_failed():
    server = SimpleNamespace(options=SimpleNamespace(health_interval=0.05), sessions=1, draining=False,
                             health=Health())
    runs: list[float] = []

    def test() -> list:
        runs.append(time.monotonic())
        raise OSError("the disk went away")

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(run_health, server, test)
            await trio.sleep(0.5)
            assert runs == []  # a session is open: the board is in use
            server.sessions = 0
            with trio.fail_after(10):
                while server.health.checks["failed"] < 2:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert not server.health.ok
    assert server.health.reason == "the self-test raised OSError: the disk went away"


@pytest.fixture(scope="module")
def spin_lib(tmp_path_factory):
    gcc = need_program("gcc", "builds the spinning host function")
    folder = tmp_path_factory.mktemp("spin")
    (folder / "spin.c").write_text(SPIN_C)
    out = folder / "spin.so"
    subprocess.run([gcc, "-O1", "-shared", "-fPIC", "-I", str(REPO / "tests" / "native" / "fixtures"), "-o",
                    str(out), str(folder / "spin.c")], check=True, capture_output=True)
    return out


def _session(call_timeout, timeout=float("inf")):
    if not sys.platform.startswith("linux"):
        pytest.skip("native workers run on Linux")
    from rpcsrv.native.host import NativeSession

    native = NativeSession("isolated", 256 << 20, timeout, "native", call_timeout=call_timeout)
    native.account = MemoryAccount(256 << 20)
    return native


def test_a_call_past_the_call_timeout_kills_the_worker(spin_lib: Path):
    from rpcsrv.native.proxy import CallTimeout

    native = _session(0.5)
    try:
        assert native.isolate_all  # every library in the worker: where a call can be stopped
        fn = native.load(str(spin_lib)).get_function("spin")
        a = native.zeros(4).view("float32")  # in the arena the worker maps: the call sees later writes
        a[0] = -1
        fn(a)  # returns: native code runs under the watchdog
        a[0] = 1
        pid = native.worker.pid
        t0 = time.monotonic()
        with pytest.raises(CallTimeout, match=r"RPCCallTimeout: spin ran longer than this board's call timeout "
                                              r"\(0.5 s, --call-timeout\); its native worker was killed"):
            fn(a)
        assert 0.45 < time.monotonic() - t0 < 5
        assert "call timeout" in native.worker.dead and not native.worker.alive
        assert native.worker.process.proc.poll() is not None, f"worker {pid} still runs"
        assert native.worker_counts() == (0, 1, 1)  # counted as a worker that did not end by closing
        assert native.account.used < 1 << 20  # the worker's cost went back to the session
    finally:
        native.close()


def test_the_session_deadline_keeps_its_own_error(spin_lib: Path):
    from rpcsrv.native.library import NativeError
    from rpcsrv.native.proxy import CallTimeout

    native = _session(30.0, timeout=6.0)  # the session ends long before the call timeout
    try:
        fn = native.load(str(spin_lib)).get_function("spin")
        a = native.zeros(4).view("float32")
        a[0] = 1
        with pytest.raises(NativeError, match="session deadline") as info:
            fn(a)
        assert not isinstance(info.value, CallTimeout)
    finally:
        native.close()
