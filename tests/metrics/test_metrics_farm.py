"""A board registered with TVM's real tracker: /metrics shows the registration (lost and regained
with the tracker) and refused clients; every metric family the board declares is served, documented
in docs/deploy.md, and every metric the Grafana dashboard (docs/grafana-dashboard.json) queries
exists.  Also: without prometheus_client, ``--metrics-port`` is one clear error line and a board
without the flag runs as before."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO, ServerProcess, need_module
from metrics_helpers import MetricsBoard, wait_scrape

tvm = need_module("tvm", "TVM's tracker and client (apache-tvm)")
need_module("tornado", "TVM's tracker needs tornado")
need_module("prometheus_client", "the metrics endpoint (pip install 'rpcsrv[metrics]')")

from rpcsrv.board.observe.collector import NAMES  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tracker(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port",
                             str(port), "--port-end", str(port + 1)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # a group: it serves from a child
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    _stop(proc)
    raise TimeoutError("TVM's tracker did not start")


def _stop(tracker: subprocess.Popen) -> None:
    """The tracker and its server process (TVM's PopenWorker), which would keep its connections."""
    try:
        os.killpg(tracker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    tracker.wait()


def _sample_names(scrape) -> set[str]:
    """The sample names a family of this scrape may have (also the families without samples now, such as
    the per-session memory with no session open)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return scrape.names() | {f.name + x for f in scrape.families.values() for x in suffixes.get(f.type, ("",))}


def test_tracker_state_and_every_family(tmp_path):
    port = _free_port()
    tracker = _tracker(port)
    board = MetricsBoard("--key", "farm-x", "--tracker", f"127.0.0.1:{port}", workdir=tmp_path)
    try:
        up = wait_scrape(board, lambda s: s("rpcsrv_tracker_registered") == 1)
        assert up("rpcsrv_tracker_registered") == 1 and up("rpcsrv_tracker_registrations_total") == 1
        (info,) = up.families["rpcsrv_board_info"].samples
        assert info.value == 1 and info.labels["key"] == "farm-x" and info.labels["native"] == "isolated"
        assert re.fullmatch(r"\d+\.\d+.*|unknown", info.labels["version"])
        assert set(NAMES) <= set(up.families), set(NAMES) - set(up.families)  # every declared family is served
        with pytest.raises(Exception):  # a client without the tracker's match key is turned away
            tvm.rpc.connect("127.0.0.1", board.port, key="farm-x")
        refused = wait_scrape(board, lambda s: s("rpcsrv_sessions_refused_total", reason="key") == 1)
        assert refused("rpcsrv_sessions_refused_total", reason="key") == 1 and refused("rpcsrv_sessions_total") == 0
        # a session through the tracker, as a farm client gets one
        remote = tvm.rpc.connect_tracker("127.0.0.1", port).request("farm-x", session_timeout=30)
        assert remote.get_function("tvm.rpc.server.workpath")("a").endswith("a")
        assert board.scrape()("rpcsrv_sessions_open") == 1
        del remote
        wait_scrape(board, lambda s: s("rpcsrv_sessions_ended_total", reason="closed") == 1)

        _stop(tracker)
        down = wait_scrape(board, lambda s: s("rpcsrv_tracker_registered") == 0)
        assert down("rpcsrv_tracker_registered") == 0
        tracker = _tracker(port)
        back = wait_scrape(board, lambda s: s("rpcsrv_tracker_registrations_total") == 2)
        assert back("rpcsrv_tracker_registered") == 1 and back("rpcsrv_tracker_registrations_total") == 2

        # the Grafana dashboard queries only metrics a board serves
        dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        exprs += [v["query"] for v in dashboard["templating"]["list"]]
        queried = {m for e in exprs for m in re.findall(r"\b((?:rpcsrv|process)_[a-z_]+)\b", e)}
        assert len(queried) >= 15 and queried <= _sample_names(back), queried - _sample_names(back)
        assert {n for n in NAMES if not n.startswith("rpcsrv_limit")} <= {
            re.sub(r"_(total|bucket|sum|count)$", "", q) for q in queried} | {"rpcsrv_start_time_seconds",
                                                                                   "rpcsrv_connections_open"}
    finally:
        board.stop()
        _stop(tracker)


def test_docs_name_every_metric():
    text = (REPO / "docs" / "deploy.md").read_text()
    for name in NAMES:
        assert re.search(rf"`{name}(_total|_bucket|_sum|_count)?[`{{]", text), f"{name} is not in docs/deploy.md"


_NO_PROMETHEUS = ("import sys; sys.modules['prometheus_client'] = None; from rpcsrv.cli import main; "
                  "sys.exit(main(sys.argv[1:]))")


def test_without_prometheus_client_one_clear_line(tmp_path):
    out = subprocess.run([sys.executable, "-c", _NO_PROMETHEUS, "serve", "--port", "0", "--metrics-port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr == ("rpcsrv: error: --metrics-port needs the Python package prometheus_client: "
                          "pip install 'rpcsrv[metrics]'\n")
    for bad, says in ((["--metrics-port", "70000"], "is not a TCP port"),
                      (["--metrics-host", "::1"], "needs --metrics-port")):
        out = subprocess.run([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", *bad], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_board_without_metrics_needs_no_prometheus_client(tmp_path):
    """No flag: the board serves without importing prometheus_client or h11 at all."""
    srv = ServerProcess(workdir=tmp_path)
    try:
        code = ("import sys; sys.modules['prometheus_client'] = sys.modules['h11'] = None\n"
                "import rpcsrv.board.server, rpcsrv.farm.run, rpcsrv.cli\n")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        from rpcsrv.client import rpc

        with rpc.connect("127.0.0.1", srv.port) as sess:
            assert sess.get_function("tvm.rpc.server.workpath")("x").endswith("x")
    finally:
        srv.stop()


def test_busy_metrics_port_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", "--metrics-port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"metrics port 127.0.0.1:{port}" in out.stderr, out.stderr
