"""/metrics after a scripted session of the real apache-tvm 0.27 client, parsed by prometheus_client's
own text parser: the values, not just the names.

The client talks to the board through a byte-counting relay (an independent count of the wire);
the board runs ``--isolate all`` so that the model loads in a native worker (counted).  Checked:
exactly N small calls (requests by code, latency by kind), a model run counted with its duration,
an error counted by code, memory per session and server-wide, workers alive/started/crashed, bytes
in/out equal to the relay's, and the session ended with reason ``closed``.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import need_module
from metrics_helpers import MetricsBoard, Relay, wait_scrape

TESTS = Path(__file__).resolve().parent.parent
for sub in ("executor", "loader", "native", "interop"):
    sys.path.insert(0, str(TESTS / sub))

tvm = need_module("tvm", "the real TVM client (apache-tvm)")
need_module("prometheus_client", "the metrics endpoint (pip install 'rpcsrv[metrics]')")

from native_helpers import build_c  # noqa: E402
from test_tvm_graph import GraphModule, inputs, seed_tree  # noqa: E402
from loader_fixtures import compile_library  # noqa: E402
from rpcsrv.loader import BLOB_SYMBOL, build_blob  # noqa: E402

N_SMALL = 25
N_RUNS = 3


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    srv = MetricsBoard("--isolate", "all", workdir=tmp_path_factory.mktemp("work"))
    yield srv
    assert srv.alive(), srv.stderr()
    srv.stop()


@pytest.fixture(scope="module")
def seed_so(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed") / "ej_seed_full.so"
    return compile_library(build_blob(seed_tree()), BLOB_SYMBOL, "host", out)


def _delta(after, before, name, **labels):
    return after(name, **labels) - before(name, **labels)


def test_scripted_session_is_counted(board, seed_so):
    start = board.scrape()
    assert start("rpcsrv_sessions_open") == 0 and start("rpcsrv_native_workers_alive") == 0
    relay = Relay(board.port)
    sess = tvm.rpc.connect("127.0.0.1", relay.port)
    f = sess.get_function("tvm.rpc.server.workpath")
    f("x")
    a = board.scrape()
    assert a("rpcsrv_sessions_open") == 1 and a("rpcsrv_sessions_total") == start("rpcsrv_sessions_total") + 1
    for _ in range(N_SMALL):
        f("x")
    b = board.scrape()
    assert _delta(b, a, "rpcsrv_requests_total", code="call_func") == N_SMALL
    assert _delta(b, a, "rpcsrv_call_seconds_count", kind="small_call") == N_SMALL
    assert _delta(b, a, "rpcsrv_call_seconds_bucket", kind="small_call", le="+Inf") == N_SMALL
    assert 0 < _delta(b, a, "rpcsrv_call_seconds_sum", kind="small_call") < N_SMALL * 0.5
    assert sum(_delta(b, a, "rpcsrv_requests_total", code=c) for c in ("get_global_func", "copy_to_remote")) == 0
    assert _delta(b, a, "rpcsrv_request_errors_total", code="call_func") == 0

    # a model (the seed ExampleJSON graph, built by gcc) in the session's native worker, run N_RUNS times
    dev = sess.cpu(0)
    sess.upload(str(seed_so))
    lib = sess.load_module(seed_so.name)
    gmod = GraphModule(lib["default"](dev))
    xs = inputs()
    for i, x in enumerate(xs):
        gmod.set_input(f"input{i}", tvm.runtime.tensor(x, dev))
    big = tvm.runtime.tensor(np.ones(1 << 18, "float32"), dev)  # 1 MiB held by the session
    c = board.scrape()
    for _ in range(N_RUNS):
        gmod.f["run"]()
    out = gmod.f["get_output"](0).numpy()
    np.testing.assert_allclose(out, ((xs[0] + xs[1]) - xs[2]) * xs[3], rtol=1e-6)
    d = board.scrape()
    assert _delta(d, c, "rpcsrv_model_run_seconds_count") == N_RUNS
    assert _delta(d, c, "rpcsrv_call_seconds_count", kind="model_run") == N_RUNS
    assert _delta(d, c, "rpcsrv_model_run_seconds_sum") > 0
    assert d("rpcsrv_model_run_seconds_bucket", le="+Inf") == d("rpcsrv_model_run_seconds_count")
    assert c("rpcsrv_call_seconds_count", kind="upload") >= start("rpcsrv_call_seconds_count", kind="upload") + 1
    assert c("rpcsrv_call_seconds_count", kind="copy") >= start("rpcsrv_call_seconds_count", kind="copy") + 5
    assert c("rpcsrv_call_seconds_count", kind="module_call") > start("rpcsrv_call_seconds_count",
                                                                      kind="module_call")
    assert d("rpcsrv_native_workers_alive") == 1
    assert _delta(d, start, "rpcsrv_native_workers_started_total") == 1
    held = d("rpcsrv_session_memory_bytes", slot="0")
    assert held >= (1 << 20) + (32 << 20)  # the tensor, and the native worker's own cost (WORKER_COST)
    assert d("rpcsrv_memory_used_bytes") == held  # the only session: the server-wide account is its

    # an error answer, counted under its RPC code
    with pytest.raises(Exception, match="no file"):
        sess.load_module("<b>missing</b>.so")
    e = board.scrape()
    assert _delta(e, d, "rpcsrv_request_errors_total", code="call_func") == 1
    assert _delta(e, d, "rpcsrv_requests_total", code="call_func") == 1

    del big, gmod, lib, f, dev, sess  # a Device holds its session too
    gc.collect()
    up, down = relay.counts()
    end = wait_scrape(board, lambda s: s("rpcsrv_sessions_open") == 0)
    assert _delta(end, start, "rpcsrv_sessions_ended_total", reason="closed") == 1
    assert end("rpcsrv_native_workers_alive") == 0 and end("rpcsrv_memory_used_bytes") == 0
    assert ("rpcsrv_session_memory_bytes", (("slot", "0"),)) not in end.samples
    # bytes: exactly what crossed the relay, each way
    assert _delta(end, start, "rpcsrv_received_bytes_total") == up > 1 << 20  # the 1 MiB tensor went up
    assert _delta(end, start, "rpcsrv_sent_bytes_total") == down > 0


def test_native_crash_is_counted(board, tmp_path):
    """A worker killed by SIGSEGV counts as crashed at once (the session still open), and stays counted."""
    c_target = build_c("c_target_kernels", tmp_path)
    before = board.scrape()
    sess = tvm.rpc.connect(board.host, board.port)
    sess.upload(str(c_target), "kernels.so")
    lib = sess.load_module("kernels.so")
    with pytest.raises(Exception, match="native code crashed"):
        lib["crash"]()
    during = board.scrape()
    assert _delta(during, before, "rpcsrv_native_workers_crashed_total") == 1
    assert _delta(during, before, "rpcsrv_native_workers_started_total") == 1
    assert during("rpcsrv_native_workers_alive") == 0
    lib = sess.load_module("kernels.so")  # a fresh worker for the same session
    assert lib["twice_plus_one"](1) == 3
    again = board.scrape()
    assert _delta(again, before, "rpcsrv_native_workers_started_total") == 2
    assert again("rpcsrv_native_workers_alive") == 1
    del lib, sess
    gc.collect()
    end = wait_scrape(board, lambda s: s("rpcsrv_sessions_open") == 0)
    assert _delta(end, before, "rpcsrv_native_workers_crashed_total") == 1  # counters never go back
    assert _delta(end, before, "rpcsrv_native_workers_started_total") == 2


def test_labels_stay_bounded(board):
    """Only the bounded label names; no peer address anywhere in /metrics."""
    scrape = board.scrape()
    allowed = {"code", "kind", "reason", "result", "slot", "limit", "le", "version", "key", "native", "machine",
               "hostname"}
    for fam in scrape.families.values():
        for s in fam.samples:
            assert set(s.labels) <= allowed, (s.name, s.labels)
    assert "127.0.0.1:" not in scrape.text and "missing" not in scrape.text
