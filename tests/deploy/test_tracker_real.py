"""rpcsrv boards in a farm run by TVM's real tracker and proxy, driven by TVM's real client.

* two boards under one key share 20 requests, every output checked against onnxruntime; the tracker
  is killed and restarted midway, the boards re-register within seconds and the requests resume;
* ``tracker.summary()`` lists each board;
* a board behind TVM's proxy serves a model;
* SIGTERM during a session: the client gets a clean error, the workspace is empty, the tracker no
  longer lists the board;
* the per-session log line and ``--log-json``.
"""

from __future__ import annotations

import json
import signal
import time

import numpy as np
import pytest

from conftest import ServerProcess, need_module
from farm import TvmService, hil_runner, wait_until

KEY = "board-x"


@pytest.fixture(scope="module")
def tvm():
    need_module("tornado", "TVM's tracker and proxy need tornado (pip install tornado)")
    return need_module("tvm", "the real TVM tracker, proxy and client come from `pip install apache-tvm`")


@pytest.fixture(scope="module")
def cases(tvm, tmp_path_factory):
    return hil_runner.build_cases(tmp_path_factory.mktemp("libs"))


def listed_boards(tvm, port: int, key: str = KEY) -> list:
    try:
        info = tvm.rpc.connect_tracker("127.0.0.1", port).summary()
    except (RuntimeError, OSError):
        return []
    return sorted(s["addr"][1] for s in info["server_info"] if s["key"] == "server:" + key)


def board(tracker_port: int, workdir, *extra: str) -> ServerProcess:
    return ServerProcess("--key", KEY, "--tracker", f"127.0.0.1:{tracker_port}", *extra, workdir=workdir)


def test_two_boards_twenty_requests_tracker_restart(tvm, cases, tmp_path):
    tracker = TvmService("tracker")
    boards = [board(tracker.port, tmp_path / f"board{i}") for i in range(2)]
    try:
        ports = sorted(b.port for b in boards)
        assert wait_until(lambda: listed_boards(tvm, tracker.port) == ports, 15), tracker.output()
        info = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).summary()
        assert info["queue_info"][KEY] == {"free": 2, "pending": 0}
        tally = hil_runner.Tally()
        for i in range(20):
            if i == 10:  # the tracker dies and comes back on the same port
                tracker.stop()
                time.sleep(1.0)
                t0 = time.monotonic()
                tracker = TvmService("tracker", tracker.port)
                assert wait_until(lambda: listed_boards(tvm, tracker.port) == ports, 15), "boards did not return"
                rejoin = time.monotonic() - t0
                print(f"boards re-registered {rejoin:.1f}s after the tracker restarted")
                assert rejoin < 8.0
            hil_runner.request_and_run(tvm, "127.0.0.1", tracker.port, KEY, cases[i % 2], tally, timeout=30)
        assert tally.ok == 20 and not tally.failed
        assert sorted(tally.boards) == sorted(str(tmp_path / f"board{i}") for i in range(2))
        assert min(tally.boards.values()) >= 5, tally.boards  # the tracker's FIFO spreads the requests
        for b in boards:
            assert b.alive()
            served = tally.boards[str(b_workdir(b, tmp_path))]
            assert wait_until(lambda: b.stderr().count("session peer=") == served, 10), b.stderr()
    finally:
        for b in boards:
            b.stop()
        tracker.stop()
    assert [p for b in range(2) for p in (tmp_path / f"board{b}").iterdir()] == []


def b_workdir(b: ServerProcess, tmp_path):
    for i in range(2):
        if f"board{i}" in " ".join(b.proc.args):
            return tmp_path / f"board{i}"
    raise AssertionError("unknown board")


def test_board_through_real_proxy_runs_a_model(tvm, cases, tmp_path):
    proxy = TvmService("proxy", None, "--web-port", "0")  # no web page (its default port 8888 may be taken)
    srv = ServerProcess("--key", "board-p", "--proxy", f"127.0.0.1:{proxy.port}", workdir=tmp_path)
    try:
        for case in cases:  # two sessions in a row: the board waits at the proxy again after each
            sess = wait_until(lambda: _try_connect(tvm, proxy.port, "board-p"), 15)
            assert sess is not None, srv.stderr() + proxy.output()
            assert hil_runner.run_case(tvm, sess, case) < 1e-3
            del sess
        assert wait_until(lambda: srv.stderr().count("session peer=") == 2, 10), srv.stderr()
    finally:
        srv.stop()
        proxy.stop()
    assert list(tmp_path.iterdir()) == []


def _try_connect(tvm, port, key):
    try:
        return tvm.rpc.connect("127.0.0.1", port, key=key, session_timeout=30)
    except RuntimeError:
        return None


def test_sigterm_during_session(tvm, cases, tmp_path):
    tracker = TvmService("tracker")
    srv = board(tracker.port, tmp_path)
    try:
        assert wait_until(lambda: listed_boards(tvm, tracker.port) == [srv.port], 15)
        sess = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).request(KEY)
        case = cases[1]
        sess.upload(str(case.library))
        gmod = sess.load_module(case.library.name)["default"](sess.cpu(0))
        assert len(list(tmp_path.iterdir())) == 1  # the session's workspace, holding the library
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(15) == 0
        with pytest.raises(Exception, match="shutting down"):
            gmod["run"]()
        assert list(tmp_path.iterdir()) == []
        assert listed_boards(tvm, tracker.port) == []
        info = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).summary()
        assert info["queue_info"].get(KEY, {"free": 0})["free"] == 0
        log = srv.stderr()
        assert "end=shutdown" in log and "rpcsrv: stopped" in log
    finally:
        srv.stop()
        tracker.stop()


def test_session_timeout_from_handshake(tvm, tmp_path):
    tracker = TvmService("tracker")
    srv = board(tracker.port, tmp_path)
    try:
        assert wait_until(lambda: listed_boards(tvm, tracker.port) == [srv.port], 15)
        sess = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).request(KEY, session_timeout=1)
        time.sleep(1.5)
        with pytest.raises(Exception, match="RPCSessionTimeoutError"):
            sess.get_function("tvm.rpc.server.workpath")("x")
        # the board offers itself again after the timed-out session
        sess2 = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).request(KEY, session_timeout=10)
        assert sess2.get_function("tvm.rpc.server.workpath")("x")
        assert "end=timeout" in srv.stderr()
    finally:
        srv.stop()
        tracker.stop()


def test_log_json_session_record(tvm, cases, tmp_path):
    srv = ServerProcess("--key", "k", "--log-json", workdir=tmp_path)
    try:
        sess = tvm.rpc.connect(srv.host, srv.port, key="k")
        hil_runner.run_case(tvm, sess, cases[0])
        with pytest.raises(Exception):
            sess.load_module("missing.blob")
        del sess
        lines = wait_until(lambda: [json.loads(x) for x in srv.stderr().splitlines() if '"event": "session"' in x], 10)
    finally:
        srv.stop()
    assert lines, srv.stderr()
    rec = lines[0]
    assert rec["key"] == "k" and rec["end"] == "closed" and rec["level"] == "info"
    assert rec["calls"] >= 8 and rec["errors"] >= 1
    assert rec["bytes_in"] > cases[0].library.stat().st_size and rec["bytes_out"] > 400  # 10x10 float32 out
    assert rec["peer"].startswith("127.0.0.1:") and 0 < rec["duration"] < 30
    for line in srv.stderr().splitlines():
        if line.startswith("{"):
            json.loads(line)


def test_bad_tracker_address_is_a_clear_error():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rpcsrv", "serve", "--key", "k", "--tracker", "nohost"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--tracker must be HOST:PORT" in out.stderr
    out = subprocess.run([sys.executable, "-m", "rpcsrv", "serve", "--tracker", "127.0.0.1:9"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "need --key" in out.stderr


def test_unused_numpy_reference_is_real(cases):
    # the expected outputs are onnxruntime's, not copies of what a board returned
    seed = cases[0]
    x = [seed.inputs[f"input{i}"] for i in range(4)]
    np.testing.assert_allclose(seed.expected[0], ((x[0] + x[1]) - x[2]) * x[3], rtol=1e-6)


def test_idle_timeout_closes_only_quiet_sessions(tvm, tmp_path):
    srv = ServerProcess("--idle-timeout", "1", workdir=tmp_path)
    try:
        busy = tvm.rpc.connect(srv.host, srv.port)
        workpath = busy.get_function("tvm.rpc.server.workpath")
        for _ in range(5):  # 2.5 s of activity, never 1 s quiet
            assert workpath("x")
            time.sleep(0.5)
        quiet = tvm.rpc.connect(srv.host, srv.port)
        assert quiet.get_function("tvm.rpc.server.workpath")("x")
        time.sleep(1.6)
        with pytest.raises(Exception, match="RPCSessionIdleError"):
            quiet.get_function("tvm.rpc.server.workpath")("x")
        assert wait_until(lambda: "end=idle" in srv.stderr(), 10), srv.stderr()
    finally:
        srv.stop()


def test_runner_check_catches_a_wrong_output(tvm, cases, tmp_path):
    """The HIL runner's comparison can fail: a reference off by 1e-3 is reported as a mismatch."""
    srv = ServerProcess(workdir=tmp_path)
    try:
        case = cases[0]
        wrong = hil_runner.Case(case.name, case.library, case.inputs, [case.expected[0] + 1e-3])
        sess = tvm.rpc.connect(srv.host, srv.port)
        assert hil_runner.run_case(tvm, sess, case) < 1e-5
        with pytest.raises(AssertionError, match="max error"):
            hil_runner.run_case(tvm, sess, wrong)
    finally:
        srv.stop()
