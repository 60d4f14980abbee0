"""Repeated native calls answered by the session's worker while it holds the connection
(``rpcsrv.board.baton``, ``rpcsrv.native.replay``), driven by the real apache-tvm 0.27 client and by
rpcsrv's own client in the classic dialect.

Both loops run: the worker's loop in C (``shim.c``) and its Python fallback.  The kernels
(``fixtures/loan_kernels.c``) leave a trace of every run, so a call skipped or run twice
shows in the numbers; the metrics say how many requests the worker answered (the loan really happened)
and the session's memory says that the handle counts the worker leaves are right (no handle leaked or
lost).  Errors and crashes of a call the worker runs end as on the server's own path.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import need_module
from native_helpers import build_c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "metrics"))
from metrics_helpers import MetricsBoard, wait_scrape  # noqa: E402

tvm = need_module("tvm", "the real TVM client")
from tvm import rpc  # noqa: E402

N = 16


#: imported at start-up from the private folder: an editable install's finder would find rpcsrv's modules
#: in the checkout, wherever that is, once the private copy cannot be read
_NO_EDITABLE = ("import sys\n"
                "sys.meta_path[:] = [f for f in sys.meta_path\n"
                "                    if not getattr(f, '__module__', '').startswith('__editable__')]\n")


def _private_copy(folder: Path) -> str:
    """A copy of the rpcsrv package in a folder only its owner may enter, as a checkout or a virtualenv
    in root's home is on a fresh machine: a root server's worker, once it has dropped to ``nobody``,
    can import nothing more from it."""
    import shutil

    import rpcsrv

    shutil.copytree(Path(rpcsrv.__file__).resolve().parent, folder / "rpcsrv",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "sitecustomize.py").write_text(_NO_EDITABLE)
    folder.chmod(0o700)
    return str(folder)


def _loan_by_check(args: tuple, env: dict) -> str:
    """What ``rpcsrv check`` (same flags, same environment) says of the loan on this machine."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-m", "rpcsrv", "check", "--json", *args], env=env, cwd=env["PYTHONPATH"],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    return report["smoke"]["native"]["loan"]


@pytest.fixture(scope="module", params=["c", "python", "inprocess"])
def board(request, tmp_path_factory):
    """A board whose workers serve loans with the loop in C (the shim's) or the Python one (the fallback
    for a shim without it), or (``--native inprocess``) whose own thread does, with the C loop.  The
    board runs rpcsrv from a folder only root may read (when root: the worker drops to nobody), and
    ``loan`` is what ``rpcsrv check`` says of the loan with the same flags and environment.  (Both start
    in that folder: ``python -m`` looks in the current folder first.)"""
    need_module("prometheus_client", "the loan's metrics")
    env = {**os.environ, "RPCSRV_LOAN_LOOP": "python" if request.param == "python" else "c",
           "PYTHONPATH": _private_copy(tmp_path_factory.mktemp("private"))}
    args = ("--native", "inprocess") if request.param == "inprocess" else ()
    loan = _loan_by_check(args, env)
    srv = MetricsBoard(*args, workdir=tmp_path_factory.mktemp("loan-work"), env=env, cwd=env["PYTHONPATH"])
    srv.inprocess = request.param == "inprocess"
    srv.loan = loan
    yield srv
    assert srv.alive(), "the server died during the tests"
    srv.stop()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return build_c("loan_kernels", tmp_path_factory.mktemp("loan"))


def _session(board, kernels):
    remote = rpc.connect(board.host, board.port)
    remote.upload(str(kernels), "loan.so")
    return remote, remote.load_module("loan.so"), remote.cpu()


def _loaned(board) -> float:
    return board.scrape()("rpcsrv_native_loaned_requests_total")


def _assert_loaned(board, loaned: float, repeats: int) -> None:
    """Most repeated calls were answered by the loan wherever ``rpcsrv check`` says it can happen (on
    Linux it must say so); none where it says it cannot."""
    if sys.platform.startswith("linux"):
        assert board.loan.startswith("in force"), board.loan
    if board.loan.startswith("in force"):
        assert loaned >= 0.9 * repeats, (loaned, board.loan)  # the first few go through the server
    else:
        assert loaned == 0, (loaned, board.loan)


def test_every_repeated_call_runs_once(board, kernels):
    """``f(a, b)`` and ``lib["f"](a, b)`` 300 times each: every run counted, most answered by the worker."""
    remote, lib, dev = _session(board, kernels)
    x = np.arange(N, dtype="float32") + 1
    a, b = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(np.zeros(N, "float32"), dev)
    before = _loaned(board)
    f = lib["accumulate"]
    for _ in range(300):
        f(a, b)
    np.testing.assert_array_equal(b.numpy(), 300 * x)
    for _ in range(300):
        lib["accumulate"](a, b)  # a lookup, the call and the free of the function: all three repeated
    np.testing.assert_array_equal(b.numpy(), 600 * x)
    _assert_loaned(board, _loaned(board) - before, 300 + 3 * 300)


def test_calls_between_other_requests(board, kernels):
    """Copies between the calls end each loan at a packet boundary: every result still right."""
    remote, lib, dev = _session(board, kernels)
    f = lib["accumulate"]
    b = tvm.runtime.tensor(np.zeros(N, "float32"), dev)
    a = tvm.runtime.tensor(np.zeros(N, "float32"), dev)
    expected = np.zeros(N, "float32")
    for k in range(40):
        x = np.full(N, k, "float32")
        a.copyfrom(x)
        for _ in range(k % 4):
            f(a, b)
            expected += x
        np.testing.assert_array_equal(b.numpy(), expected)
    assert remote.get_function("tvm.rpc.server.workpath")("x").endswith("x")


def test_handle_counts_survive_the_loan(board, kernels):
    """Lookups and frees the worker answered leave the session's handle table as the client holds it:
    the session's memory (every handle is charged) ends where it started, and a function handle the
    client still holds keeps working after the loan."""
    remote, lib, dev = _session(board, kernels)
    a, b = tvm.runtime.tensor(np.ones(N, "float32"), dev), tvm.runtime.tensor(np.zeros(N, "float32"), dev)
    held = lib["accumulate"]
    held(a, b)

    def memory() -> float:
        gc.collect()
        scrape = board.scrape()
        return sum(v for (name, _), v in scrape.samples.items() if name == "rpcsrv_session_memory_bytes")

    start = memory()
    for _ in range(200):
        lib["accumulate"](a, b)
    a.copyfrom(np.ones(N, "float32"))  # ends the loan: the counts are back with the server
    assert memory() == start
    held(a, b)
    np.testing.assert_array_equal(b.numpy(), np.full(N, 202, "float32"))
    del held
    lib["accumulate"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.full(N, 203, "float32"))


def test_error_of_a_repeated_call_is_the_usual_error(board, kernels):
    remote, lib, dev = _session(board, kernels)
    f = lib["count_or_fail"]
    limit = tvm.runtime.tensor(np.full(1, 50, "float32"), dev)
    count = tvm.runtime.tensor(np.zeros(1, "float32"), dev)
    for _ in range(50):
        f(limit, count)
    with pytest.raises(Exception, match="count_or_fail: past the limit"):
        f(limit, count)  # answered through the server: the worker's call raised
    with pytest.raises(Exception, match="count_or_fail: past the limit"):
        f(limit, count)
    assert count.numpy()[0] == 52
    limit.copyfrom(np.full(1, 1000, "float32"))
    for _ in range(100):
        f(limit, count)
    assert count.numpy()[0] == 152


def test_crash_in_a_repeated_call_ends_only_that_call(board, kernels):
    """The worker dies in a call it took off the socket: that call is answered with the crash, the
    session goes on (a fresh worker for the same session), and so does the server."""
    if board.inprocess:
        pytest.skip("--native inprocess: a crash of native code is the server's (the mode for trusted code)")
    remote, lib, dev = _session(board, kernels)
    f = lib["count_or_crash"]
    limit = tvm.runtime.tensor(np.full(1, 30, "float32"), dev)
    count = tvm.runtime.tensor(np.zeros(1, "float32"), dev)
    for _ in range(30):
        f(limit, count)
    with pytest.raises(Exception, match=r"native code crashed \(killed by SIGSEGV\)"):
        f(limit, count)
    with pytest.raises(Exception, match="native worker of this session is gone"):
        f(limit, count)
    assert count.numpy()[0] == 31  # the crashing run's count is in the shared array
    lib = remote.load_module("loan.so")
    limit.copyfrom(np.full(1, 1000, "float32"))
    g = lib["count_or_crash"]
    for _ in range(20):
        g(limit, count)
    assert count.numpy()[0] == 51
    assert board.alive()


def test_client_gone_during_a_loan(board, kernels):
    """A client that leaves while the worker holds its connection: the session ends, its worker with it,
    and the next session is served."""
    remote, lib, dev = _session(board, kernels)
    a, b = tvm.runtime.tensor(np.ones(N, "float32"), dev), tvm.runtime.tensor(np.zeros(N, "float32"), dev)
    f = lib["accumulate"]
    for _ in range(20):
        f(a, b)
    del f, a, b, lib, dev, remote
    gc.collect()
    scrape = wait_scrape(board, lambda s: s("rpcsrv_sessions_open") == 0)
    assert scrape("rpcsrv_sessions_open") == 0
    remote, lib, dev = _session(board, kernels)
    a, b = tvm.runtime.tensor(np.ones(N, "float32"), dev), tvm.runtime.tensor(np.zeros(N, "float32"), dev)
    for _ in range(10):
        lib["accumulate"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.full(N, 10, "float32"))


def test_the_session_deadline_ends_a_loan(board, kernels):
    """A client that never stops repeating a call: its session still ends at its deadline (the worker is
    stopped; in process, the serving thread sees its connection shut), and the board goes on."""
    connected = time.monotonic()  # (the deadline leaves the worker's start room on a loaded machine)
    remote = rpc.connect(board.host, board.port, session_timeout=10)
    remote.upload(str(kernels), "loan.so")
    f = remote.load_module("loan.so")["accumulate"]
    dev = remote.cpu()
    a, b = tvm.runtime.tensor(np.ones(N, "float32"), dev), tvm.runtime.tensor(np.zeros(N, "float32"), dev)
    with pytest.raises(Exception):
        while time.monotonic() - connected < 60:
            f(a, b)
    assert time.monotonic() - connected < 10 + 15
    remote2, lib, dev2 = _session(board, kernels)
    c = tvm.runtime.tensor(np.zeros(N, "float32"), dev2)
    lib["accumulate"](tvm.runtime.tensor(np.ones(N, "float32"), dev2), c)
    np.testing.assert_array_equal(c.numpy(), np.ones(N, "float32"))
    assert board.alive()


def test_classic_dialect_repeats_too(board, kernels):
    from rpcsrv.client.rpc import connect
    from rpcsrv.protocol import Dialect

    sess = connect(board.host, board.port, dialect=Dialect.CLASSIC)
    sess.upload(str(kernels), "loan.so")
    lib = sess.load_module("loan.so")
    dev = sess.cpu()
    x = np.arange(N, dtype="float32")
    a, b = sess.array(x, dev), sess.empty((N,), "float32", dev)
    before = _loaned(board)
    f = lib["accumulate"]
    start = time.monotonic()
    for _ in range(200):
        f(a, b)
    np.testing.assert_array_equal(b.numpy(), 200 * x)
    _assert_loaned(board, _loaned(board) - before, 167)  # (150 of 200)
    assert time.monotonic() - start < 30


def test_random_mixes_of_calls_lookups_frees_and_copies(board, kernels):
    """Random sequences of what a client does around a kernel (call a held function, look it up and call
    it, hold or drop extra function handles, copy new inputs, read the output), checked against a model
    of the numbers after every step: whatever mix of loans and server answers serves them, each call
    runs once, and the handles the client holds keep working."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    ops = st.lists(st.sampled_from(["call", "call", "call", "lookup-call", "lookup-call", "hold", "drop",
                                    "copy", "read"]), min_size=5, max_size=40)

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ops, st.integers(1, 5))
    def run(steps, scale):
        remote, lib, dev = _session(board, kernels)
        a = tvm.runtime.tensor(np.full(N, scale, "float32"), dev)
        b = tvm.runtime.tensor(np.zeros(N, "float32"), dev)
        f, held, x, expected = lib["accumulate"], [], float(scale), 0.0
        for step in steps:
            if step == "call":
                f(a, b)
                expected += x
            elif step == "lookup-call":
                lib["accumulate"](a, b)
                expected += x
            elif step == "hold":
                held.append(lib["accumulate"])
            elif step == "drop" and held:
                held.pop()
            elif step == "copy":
                x += 1
                a.copyfrom(np.full(N, x, "float32"))
            else:
                np.testing.assert_array_equal(b.numpy(), np.full(N, expected, "float32"))
        for g in held:
            g(a, b)
            expected += x
        np.testing.assert_array_equal(b.numpy(), np.full(N, expected, "float32"))

    run()
