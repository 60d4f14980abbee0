"""The board's self-test and its call watchdog, against TVM's own tracker and client.

* ``--health-interval``: a board whose self-test fails (the runtime shim its native workers load made
  unloadable) leaves ``tracker.summary()``, says why in its log, on ``/healthz`` (503) and in its
  metrics, and comes back when the file is restored (a client waiting in the tracker's queue gets it);
  behind TVM's proxy, it stops waiting there and is back likewise;
* ``--call-timeout``: a kernel compiled by apache-tvm that loops forever, called by TVM's client through the tracker,
  is cut at the timeout with an error that says so (on the event loop's path and on the thread's), and so is
  a graph run that takes too long; the
  board is free in the tracker within a second of the cut and the next request gets it; a model run
  under the watchdog (in the session's worker) still matches onnxruntime;
* the flags' bad values are one clear error line.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, ServerProcess, need_module
from farm import TvmService, hil_runner, wait_until

sys.path.insert(0, str(REPO / "tests" / "metrics"))
from metrics_helpers import MetricsBoard  # noqa: E402

KEY = "board-h"

#: a kernel compiled by apache-tvm that copies a[0] to b[0], then loops while b[0] >= 0: it returns at once for
#: a negative a[0] and never for any other (LLVM keeps a loop that stores to memory)
SPIN_TIR = """
import sys
import tvm
from tvm.script import tirx as T

@T.prim_func
def spin(a: T.Buffer((1,), "int32"), b: T.Buffer((1,), "int32")):
    T.func_attr({"global_symbol": "spin"})
    b[0] = a[0]
    while b[0] >= 0:
        b[0] = b[0] * 1

tvm.compile(spin, target="llvm").export_library(sys.argv[1])
"""


@pytest.fixture(scope="module")
def tvm():
    need_module("tornado", "TVM's tracker needs tornado (pip install tornado)")
    return need_module("tvm", "the real TVM tracker and client come from `pip install apache-tvm`")


def free_boards(tvm, port: int) -> int | None:
    """How many boards of KEY the tracker has free (None: the tracker did not answer)."""
    try:
        info = tvm.rpc.connect_tracker("127.0.0.1", port).summary()
    except (RuntimeError, OSError):
        return None
    return info["queue_info"].get(KEY, {"free": 0})["free"]


def listed(tvm, port: int) -> list:
    try:
        info = tvm.rpc.connect_tracker("127.0.0.1", port).summary()
    except (RuntimeError, OSError):
        return []
    return [s["addr"][1] for s in info["server_info"] if s["key"] == "server:" + KEY]


def test_failing_self_test_leaves_the_tracker_and_comes_back(tvm, tmp_path):
    from rpcsrv.native.shim import shim_path

    need_module("prometheus_client", "the board's /healthz and metrics (pip install 'rpcsrv[metrics]')")
    good = tmp_path / "good-libshim.so"
    shutil.copyfile(shim_path(), good)
    shim = tmp_path / "libshim.so"
    shutil.copyfile(good, shim)
    tracker = TvmService("tracker")
    srv = MetricsBoard("--key", KEY, "--tracker", f"127.0.0.1:{tracker.port}", "--health-interval", "0.5",
                       workdir=tmp_path / "work", env={**os.environ, "RPCSRV_NATIVE_SHIM": str(shim)})
    try:
        assert wait_until(lambda: listed(tvm, tracker.port) == [srv.port], 15), srv.stderr()
        assert wait_until(lambda: srv.scrape()("rpcsrv_health_checks_total", result="ok") >= 1, 20), srv.stderr()
        assert srv.get("/healthz")[::2] == (200, "ok\n")

        broken = tmp_path / "broken"  # replaced, never written in place: the server maps the good one
        broken.write_bytes(b"not a shared library\n" * 64)
        os.replace(broken, shim)
        t0 = time.monotonic()
        assert wait_until(lambda: listed(tvm, tracker.port) == [], 30), srv.stderr()
        print(f"left the tracker {time.monotonic() - t0:.1f} s after the shim broke")
        status, _, text = srv.get("/healthz")
        assert status == 503 and text.startswith("unhealthy: native smoke run:"), text
        assert "libshim.so" in text, text  # the reason names the file
        scrape = srv.scrape()
        assert scrape("rpcsrv_health_ok") == 0 and scrape("rpcsrv_health_checks_total", result="failed") >= 1
        assert scrape("rpcsrv_health_last_failure_time_seconds") > time.time() - 60
        (info,) = scrape.families["rpcsrv_health_failure_info"].samples
        assert "native smoke run" in info.labels["reason"]
        assert "failing, off the farm</span>: native smoke run:" in srv.get("/")[2]  # the status page
        log = srv.stderr()
        assert "self-test failed: native smoke run:" in log and "left tracker" in log, log
        # a client asking for the board now waits: the tracker has none to give while it is away
        waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
            lambda: tvm.rpc.connect_tracker("127.0.0.1", tracker.port).request(KEY, session_timeout=60))
        time.sleep(2)
        assert not waiting.done()

        fixed = tmp_path / "fixed"
        shutil.copyfile(good, fixed)
        os.replace(fixed, shim)
        t0 = time.monotonic()
        sess = waiting.result(timeout=30)  # the board came back, and the waiting client got it
        print(f"the waiting client got the board {time.monotonic() - t0:.1f} s after the shim was restored")
        assert sess.get_function("tvm.rpc.server.workpath")("x").endswith("x")
        assert "self-test passes again" in srv.stderr()
        assert srv.get("/healthz")[::2] == (200, "ok\n")
        assert srv.scrape()("rpcsrv_health_ok") == 1
        del sess
        assert wait_until(lambda: listed(tvm, tracker.port) == [srv.port], 15), srv.stderr()
        assert srv.alive()
    finally:
        srv.stop()
        tracker.stop()


def test_failing_self_test_leaves_the_proxy_and_comes_back(tvm, tmp_path):
    """Behind TVM's proxy: while the self-test fails no connection of the board waits there, so a client
    asking the proxy for the board waits; it gets the board once the test passes again."""
    from rpcsrv.native.shim import shim_path

    good = tmp_path / "good-libshim.so"
    shutil.copyfile(shim_path(), good)
    shim = tmp_path / "libshim.so"
    shutil.copyfile(good, shim)
    proxy = TvmService("proxy", None, "--web-port", "0")
    srv = ServerProcess("--key", "board-hp", "--proxy", f"127.0.0.1:{proxy.port}", "--health-interval", "0.5",
                        workdir=tmp_path / "work", env={**os.environ, "RPCSRV_NATIVE_SHIM": str(shim)})
    try:
        assert wait_until(lambda: "waiting at proxy" in srv.stderr(), 15), srv.stderr()
        broken = tmp_path / "broken"
        broken.write_bytes(b"not a shared library\n" * 64)
        os.replace(broken, shim)
        assert wait_until(lambda: "not waiting at proxy" in srv.stderr(), 30), srv.stderr()
        waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
            lambda: tvm.rpc.connect("127.0.0.1", proxy.port, key="board-hp", session_timeout=60))
        time.sleep(2)
        assert not waiting.done()
        fixed = tmp_path / "fixed"
        shutil.copyfile(good, fixed)
        os.replace(fixed, shim)
        sess = waiting.result(timeout=30)
        assert sess.get_function("tvm.rpc.server.workpath")("x").endswith("x")
        assert "self-test passes again" in srv.stderr()
        del sess
    finally:
        srv.stop()
        proxy.stop()


@pytest.fixture(scope="module")
def spin_lib(tvm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("spin")
    (folder / "build.py").write_text(SPIN_TIR)  # (TVMScript reads the function's source from a file)
    out = folder / "spin.so"
    subprocess.run([sys.executable, str(folder / "build.py"), str(out)], check=True, capture_output=True,
                   timeout=300)
    return out


def _cut(tvm, tracker_port: int, call, what: str = "spin") -> float:
    """Run ``call`` (it hangs in native code); assert the cut's error; the seconds until the tracker has the
    board free again, measured from the error."""
    t0 = time.monotonic()
    with pytest.raises(Exception, match=rf"RPCCallTimeout: {what} ran longer than this board's call timeout \(2 s"):
        call()
    cut = time.monotonic()
    assert 1.9 < cut - t0 < 10, cut - t0
    assert wait_until(lambda: free_boards(tvm, tracker_port) == 1, 5, step=0.02)
    return time.monotonic() - cut


@pytest.fixture(scope="module")
def long_graph(tmp_path_factory):
    """A graph of 96 chained 2048 x 2048 float32 matmuls (1.6 TFLOP: 8 s on this 2-core machine's BLAS, longer
    on a board), a raw blob."""
    from onnx import TensorProto, helper

    from rpcsrv.client.compiler import compile_onnx

    nodes = [helper.make_node("MatMul", [f"y{i - 1}" if i else "x", "x"], [f"y{i}"]) for i in range(96)]
    graph = helper.make_graph(nodes, "long", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2048, 2048])],
                              [helper.make_tensor_value_info("y95", TensorProto.FLOAT, [2048, 2048])])
    out = tmp_path_factory.mktemp("long") / "long.blob"
    compile_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).export_library(
        str(out), fmt="blob")
    return out


def test_call_timeout_cuts_a_hung_kernel_and_frees_the_board(tvm, spin_lib, long_graph, tmp_path):
    (tmp_path / "libs").mkdir()
    cases = hil_runner.build_cases(tmp_path / "libs")
    tracker = TvmService("tracker")
    srv = ServerProcess("--key", KEY, "--tracker", f"127.0.0.1:{tracker.port}", "--call-timeout", "2",
                        workdir=tmp_path / "work")
    try:
        assert wait_until(lambda: free_boards(tvm, tracker.port) == 1, 15), srv.stderr()
        frees = []
        for path in ("loop", "thread"):
            sess = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).request(KEY, session_timeout=60)
            dev = sess.cpu(0)
            if path == "thread":  # tensors made before the worker are copied: the call takes a session thread
                a, b = tvm.runtime.empty((1,), "int32", dev), tvm.runtime.empty((1,), "int32", dev)
            sess.upload(str(spin_lib))
            spin = sess.load_module("spin.so")["spin"]
            if path == "loop":  # in the shared arena: the call is one frame the event loop waits on
                a, b = tvm.runtime.empty((1,), "int32", dev), tvm.runtime.empty((1,), "int32", dev)
            a.copyfrom(np.array([-7], "int32"))
            spin(a, b)  # the kernel runs under the watchdog, and returns
            assert b.numpy()[0] == -7
            a.copyfrom(np.array([0], "int32"))
            frees.append(_cut(tvm, tracker.port, lambda: spin(a, b)))
            with pytest.raises(Exception):  # the session is over
                spin(a, b)
        # a graph run past the timeout (96 chained 2048 x 2048 matmuls: seconds of BLAS), in the session's worker
        sess = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).request(KEY, session_timeout=60)
        sess.upload(str(long_graph))
        gmod = sess.load_module(long_graph.name)["default"](sess.cpu(0))
        gmod["set_input"]("x", tvm.runtime.tensor(np.full((2048, 2048), 1e-3, "float32"), sess.cpu(0)))
        frees.append(_cut(tvm, tracker.port, gmod["run"], "run"))
        print("board free in the tracker %s s after each cut" % ", ".join(f"{f:.2f}" for f in frees))
        assert max(frees) < 1.0, frees
        # the next request gets the board, and a model runs (in the session's worker) as onnxruntime says
        sess = tvm.rpc.connect_tracker("127.0.0.1", tracker.port).request(KEY, session_timeout=60)
        assert hil_runner.run_case(tvm, sess, cases[1]) < 1e-3
        del sess
        assert wait_until(lambda: srv.stderr().count("session peer=") == 4, 10), srv.stderr()
        log = srv.stderr()
        assert log.count("end=call-timeout") == 3 and "ran past the call timeout" in log, log
        assert srv.alive()
    finally:
        srv.stop()
        tracker.stop()
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.parametrize("flags, says", [
    (["--call-timeout", "0"], "--call-timeout must be a positive number of seconds"),
    (["--health-interval", "-1"], "--health-interval must be a positive number of seconds"),
    (["--call-timeout", "5", "--native", "inprocess"], "--call-timeout needs --native isolated"),
    (["--call-timeout", "5", "--no-native"], "--call-timeout needs --native isolated"),
])
def test_bad_flags_are_one_line(flags, says):
    out = subprocess.run([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", *flags], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_check_does_not_take_the_serve_only_flags():
    out = subprocess.run([sys.executable, "-m", "rpcsrv", "check", "--call-timeout", "5"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "unrecognized arguments" in out.stderr


def test_readme_names_the_flags():
    text = (REPO / "README.md").read_text()
    assert "`--health-interval S`" in text and "`--call-timeout S`" in text
    assert Path(REPO / "docs" / "deploy.md").read_text().count("--call-timeout") >= 2
