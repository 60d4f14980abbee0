"""``--isolate all``: every library loads in the session's worker process (not only those whose native
code runs), so sessions compute in processes of their own; a run there takes its compute slot from the
server's policy (``rpcsrv.executor.compute``) over the worker's socket."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from rpcsrv.client import compile_onnx
from conftest import module_server, need_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compiler"))
from compiler_helpers import make_model, reference  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="native workers run on Linux")


def conv_model():
    rng = np.random.default_rng(5)
    inits = {"w": rng.standard_normal((6, 3, 3, 3)).astype("float32"), "b": rng.standard_normal(6).astype("float32")}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["out"], name="relu")]
    return make_model(nodes, [("x", [1, 3, 8, 8])], [("out", [1, 6, 8, 8])], inits)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    model = conv_model()
    path = tmp_path_factory.mktemp("lib") / "conv.so"
    compile_onnx(model).export_library(str(path))
    return model, path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from module_server(tmp_path_factory, "--isolate", "all")


def test_an_examplejson_library_runs_in_the_session_worker(server, library):
    psutil = need_module("psutil", "lists the server's worker processes")
    tvm = need_module("tvm", "the real TVM client")
    model, path = library
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")
    sess = tvm.rpc.connect(server.host, server.port)
    sess.upload(str(path))
    lib = sess.load_module(path.name)
    dev = sess.cpu(0)
    ex = lib["default"](dev)
    ex["set_input"]("x", tvm.runtime.tensor(x, dev))
    ex["run"]()
    np.testing.assert_allclose(ex["get_output"](0).numpy(), reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    workers = [p for p in psutil.Process(server.proc.pid).children() if "rpcsrv.native.worker" in " ".join(p.cmdline())]
    assert workers, "the library was loaded in the server process, not in a worker"


def test_a_run_in_the_worker_takes_the_servers_compute_slot(library, monkeypatch):
    """The worker's graph executor run asks this process's policy for its slot (and nothing else does)."""
    from rpcsrv.executor import compute
    from rpcsrv.native.host import NativeSession
    from rpcsrv.native.proxy import WorkerModule
    from rpcsrv.protocol.dtypes import Device

    model, path = library
    slots = []
    real = compute.job

    def spy(*args, **kwargs):
        slots.append((compute.POLICY.running, kwargs.get("local", True)))
        return real(*args, **kwargs)

    monkeypatch.setattr(compute, "job", spy)
    native = NativeSession("isolated", 1 << 30, isolate="all")
    try:
        mod = native.load(str(path))
        assert isinstance(mod, WorkerModule)
        ex = mod.get_function("default")(Device(1, 0))
        x = np.ones((1, 3, 8, 8), "float32")
        ex.get_function("set_input")("x", x)
        assert slots == []  # set_input is no job
        ex.get_function("run")()
        ex.get_function("run")()
        # held while the worker ran (as a job of another process: no wait for this interpreter), then given back
        assert slots == [(0, False), (0, False)] and compute.POLICY.running == 0
        got = ex.get_function("get_output")(0)
        np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    finally:
        native.close()


def test_isolate_all_only_where_workers_run():
    from rpcsrv.native.host import NativeSession

    assert NativeSession("isolated", isolate="all").isolate_all
    assert not NativeSession("inprocess", isolate="all").isolate_all
    assert not NativeSession("isolated").isolate_all
    with pytest.raises(ValueError, match="isolate"):
        NativeSession("isolated", isolate="some")


def big_model():
    """A conv big enough to run for a while (~0.1-1 s) in the worker."""
    rng = np.random.default_rng(6)
    inits = {"w": rng.standard_normal((256, 256, 3, 3)).astype("float32")}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Conv", ["c", "w"], ["out"], pads=[1, 1, 1, 1], name="conv2")]
    return make_model(nodes, [("x", [4, 256, 64, 64])], [("out", [4, 256, 64, 64])], inits)


def test_a_worker_that_dies_mid_run_gives_its_compute_slot_back(tmp_path):
    import os
    import signal
    import threading
    import time

    from rpcsrv.executor import compute
    from rpcsrv.native.host import NativeSession
    from rpcsrv.native.library import NativeError
    from rpcsrv.protocol.dtypes import Device

    path = tmp_path / "big.so"
    compile_onnx(big_model()).export_library(str(path))
    native = NativeSession("isolated", 4 << 30, isolate="all")
    errors = []
    try:
        ex = native.load(str(path)).get_function("default")(Device(1, 0))
        ex.get_function("set_input")("x", np.ones((4, 256, 64, 64), "float32"))

        def run():
            try:
                for _ in range(50):
                    ex.get_function("run")()
            except NativeError as exc:
                errors.append(str(exc))

        t = threading.Thread(target=run)
        t.start()
        deadline = time.monotonic() + 60
        while compute.POLICY.running == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert compute.POLICY.running == 1  # the worker's run holds a slot of this process's policy
        os.kill(native.worker.pid, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive() and errors and "crashed" in errors[0]
        assert compute.POLICY.running == 0  # given back with the dead worker's socket
    finally:
        native.close()


def test_isolate_auto_sends_a_session_to_its_worker_only_while_another_computes_here(library):
    """``--isolate auto`` (the server's default): a session alone computes in the server (no process, no
    message per call); one that loads while another holds modules here loads in its own worker, so two
    models never share the interpreter lock.  Both compute the same result."""
    from rpcsrv.native.host import NativeSession
    from rpcsrv.native.proxy import WorkerModule
    from rpcsrv.protocol.dtypes import Device

    model, path = library
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype("float32")
    first, second, third = (NativeSession("isolated", 1 << 30, isolate="auto") for _ in range(3))
    try:
        here = first.load(str(path))
        assert not isinstance(here, WorkerModule)  # alone: in the server process
        away = second.load(str(path))
        assert isinstance(away, WorkerModule)  # another session computes here: its own worker
        assert not isinstance(first.load(str(path)), WorkerModule)  # the first stays where it is
        for mod in (here, away):
            ex = mod.get_function("default")(Device(1, 0))
            ex.get_function("set_input")("x", x)
            ex.get_function("run")()
            got = ex.get_function("get_output")(0)
            np.testing.assert_allclose(np.asarray(got), reference(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
        first.close()
        assert not isinstance(third.load(str(path)), WorkerModule)  # nobody computes here any more
    finally:
        for native in (first, second, third):
            native.close()


def test_a_worker_waiting_for_a_compute_slot_stops_at_the_session_deadline(library):
    """A model run in a worker asks the server for a compute slot; while other sessions hold every slot
    (here: held by the test), it waits until the session's deadline at most, then the worker is stopped
    and the call fails with a clear error (before: it waited for as long as the slots stayed taken)."""
    import threading
    import time

    from rpcsrv.executor import compute
    from rpcsrv.native.host import NativeSession
    from rpcsrv.native.library import NativeError
    from rpcsrv.protocol.dtypes import Device

    _model, path = library
    native = NativeSession("isolated", 1 << 30, isolate="all")
    release, holders, held = threading.Event(), [], threading.Semaphore(0)

    def hold():
        with compute.POLICY.job(local=False):
            held.release()
            release.wait(60)

    try:
        ex = native.load(str(path)).get_function("default")(Device(1, 0))
        ex.get_function("set_input")("x", np.ones((1, 3, 8, 8), "float32"))
        for _ in range(compute.POLICY.cores):
            holders.append(threading.Thread(target=hold))
            holders[-1].start()
        for _ in holders:
            assert held.acquire(timeout=30)
        start = time.monotonic()
        native.deadline = start + 3.0  # from now: the worker's start on a loaded machine is not what is timed
        with pytest.raises(NativeError, match="no compute slot came free before the session deadline"):
            ex.get_function("run")()
        assert time.monotonic() - start < 20
        assert native.worker.dead and "deadline" in native.worker.dead
    finally:
        release.set()
        for t in holders:
            t.join(30)
        native.close()
    assert compute.POLICY.running == 0
