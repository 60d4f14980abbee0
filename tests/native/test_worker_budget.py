"""Memory budgets cover native workers: what a session's worker allocates is refused before
allocation when over the session's or the server's budget, and what it holds is charged to both.

The library is what TVM's ``export_library`` links for a classic graph (the blob and its host
functions in one .so, gcc): ``x (n floats) -> add_one -> y``, so the graph executor, created with
``lib["default"](dev)`` by the real apache-tvm client, calls native code and therefore lives in the
session's worker with ``--native isolated``; its storage is 2 x 4n bytes.  The same refusals hold with
``--native inprocess`` (the session's own accounting), ``--native off``, and ``--isolate all`` (the
ExampleJSON graph in the worker too).  Also named here: a Relax
VM's storage (``alloc_storage``) in both modes, arguments copied to the worker while a call runs, the
worker's own cost, its release when an executor is freed or the worker ends or crashes, and two
sessions that fit alone but not together in the server's budget.

Budgets here: 96 MiB per session, 128 MiB for the server; a worker costs ``WORKER_COST`` (32 MiB).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ServerProcess, need_module
from native_helpers import FIXTURES, build_c, need_program
from rpcsrv.loader import (BLOB_SYMBOL, ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule,
                           HostLibraryModule, build_blob)
from rpcsrv.native.proxy import WORKER_COST

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loader"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vm"))
from exec_helpers import GraphBuilder  # noqa: E402
from loader_fixtures import c_source  # noqa: E402

tvm = need_module("tvm", "the real TVM client")
from tvm import rpc  # noqa: E402

MB = 1 << 20
SESSION_MB, TOTAL_MB = 96, 128
BIG = 13 * MB  # floats: 104 MiB of storage, over the session budget in any mode
FITS = 5 * MB  # floats: 40 MiB of storage; worker + storage fit one session, not two in the server
SMALL = 1 << 16  # floats: 512 KiB of storage


def host_graph_library(out_dir: Path, n: int) -> Path:
    """A .so with the blob of ``x (n,) -> add_one -> y (n,)`` and the native ``add_one`` it calls."""
    g = GraphBuilder()
    x = g.input("x", (n,))
    y = g.op("add_one", [x], [((n,), "float32")])
    tree = GraphExecutorFactoryModule(g.json([y]), {}, imports=[HostLibraryModule([])])
    src = out_dir / f"graph{n}.c"
    kernels = (FIXTURES / "c_target_kernels.c").read_text().replace('#include "tvm_c_abi.h"',
                                                                   (FIXTURES / "tvm_c_abi.h").read_text())
    src.write_text(c_source(build_blob(tree), BLOB_SYMBOL).replace("int tvmgen_default_fused_add", "static int unused")
                   + "\n" + kernels)
    out = out_dir / f"graph{n}.so"
    subprocess.run([need_program("gcc"), "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True,
                   capture_output=True)
    return out


def example_json_library(out_dir: Path, n: int) -> Path:
    """The same graph with an ExampleJSON subgraph instead of native code (it runs in the server)."""
    ej = ExampleJSONModule(code=f"add_0\n  input 0 {n}\n  add 1 inputs: 0 0 shape: {n}\n")
    g = GraphBuilder()
    x = g.input("x", (n,))
    y = g.op("add_0", [x], [((n,), "float32")])
    tree = GraphExecutorFactoryModule(g.json([y]), {}, imports=[
        HostLibraryModule(symbols=[], imports=[ConstLoaderModule({}, {"add_0": []}, imports=[ej])])])
    blob = build_blob(tree)
    out = out_dir / f"ej{n}.blob"
    out.write_bytes(len(blob).to_bytes(8, "little") + blob)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget-libs")
    return {n: host_graph_library(d, n) for n in (BIG, FITS, SMALL)} | {"ej": example_json_library(d, BIG)}


def _server(tmp_path_factory, mode: str):
    native = ["--native", "isolated", "--isolate", "all" if mode == "isolate-all" else "native"] \
        if mode in ("isolated", "isolate-all") else ["--native", mode]
    srv = ServerProcess(*native, "--max-memory-mb", str(SESSION_MB),
                        "--max-total-memory-mb", str(TOTAL_MB), workdir=tmp_path_factory.mktemp(f"budget-{mode}"))
    yield srv
    assert srv.alive(), "the server died during the tests"
    srv.stop()


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    yield from _server(tmp_path_factory, "isolated")


@pytest.fixture(scope="module")
def inprocess(tmp_path_factory):
    yield from _server(tmp_path_factory, "inprocess")


@pytest.fixture(scope="module", params=["isolated", "inprocess", "off", "isolate-all"])
def any_mode(request, tmp_path_factory):
    yield from _server(tmp_path_factory, request.param)


def used(sess) -> int:
    """The bytes the session's account holds (``rpcsrv.session_stats``)."""
    stats = dict(kv.split("=") for kv in sess.get_function("rpcsrv.session_stats")().split(","))
    return int(stats["bytes"])


def load(sess, path: Path):
    sess.upload(str(path))
    lib = sess.load_module(path.name)
    sess.remove(path.name)  # the file's charge goes; the loaded module stays
    return lib


def run_graph(sess, lib, n: int):
    """Create the executor, run it on ``arange(n)`` and check ``y = x + 1``; returns the executor."""
    dev = sess.cpu(0)
    ex = lib["default"](dev)
    x = np.arange(n, dtype="float32")
    ex["set_input"]("x", tvm.runtime.tensor(x, dev))
    ex["run"]()
    np.testing.assert_array_equal(ex["get_output"](0).numpy(), x + 1)
    return ex


OVER_SESSION = rf"graph executor storage needs {8 * BIG} bytes, beyond the session memory budget " \
               rf"\(\d+ of {SESSION_MB * MB} bytes in use\)"


@pytest.mark.parametrize("kind", ["native", "ej"])
def test_storage_over_the_session_budget_is_refused_and_the_session_goes_on(any_mode, libs, kind, request):
    mode = request.node.callspec.params["any_mode"]
    sess = rpc.connect(any_mode.host, any_mode.port)
    lib = load(sess, libs[BIG if kind == "native" else "ej"])
    before = used(sess)
    in_worker = mode == "isolate-all" or (mode == "isolated" and kind == "native")
    assert (before >= WORKER_COST) == in_worker  # the library loaded in a worker, which is charged
    refusal = "native code is disabled" if kind == "native" and mode == "off" else OVER_SESSION
    with pytest.raises(Exception, match=refusal):
        lib["default"](sess.cpu(0))
    assert used(sess) - before < 4096  # refused before anything was allocated (a handle or two remain)
    if mode != "off":
        run_graph(sess, load(sess, libs[SMALL]), SMALL)  # the session (and its worker) go on
    assert any_mode.alive()


@pytest.fixture(scope="module")
def dynbatch(tmp_path_factory):
    """The Relax VM test model with a symbolic batch (x: N x 16 -> ... -> N x 8), built by apache-tvm."""
    import vm_models

    need_module("onnx", "the test model is written as an ONNX graph")
    folder = tmp_path_factory.getbasetemp() / "vm-libs"  # shared with tests/vm (vm_fixtures)
    folder.mkdir(exist_ok=True)
    return vm_models.build("dynbatch", folder)


@pytest.mark.parametrize("server", ["isolated", "inprocess"])
def test_vm_storage_over_the_budget_is_refused(request, server, dynbatch):
    """A Relax VM's storage (``alloc_storage``, sized at run time from the batch) is charged too: a
    batch of 256K rows needs more than the session has left; a batch of 4 then runs."""
    from tvm import relax

    srv = request.getfixturevalue(server)
    sess = rpc.connect(srv.host, srv.port)
    sess.upload(str(dynbatch))
    vm = relax.VirtualMachine(sess.load_module(dynbatch.name), sess.cpu())
    sess.remove(dynbatch.name)
    x = tvm.runtime.tensor(np.ones((1 << 18, 16), "float32"), sess.cpu())  # 16 MiB
    with pytest.raises(Exception, match=r"VM storage needs \d+ bytes, beyond the session memory budget"):
        vm["main"](x)
    del x
    out = vm["main"](tvm.runtime.tensor(np.ones((4, 16), "float32"), sess.cpu())).numpy()
    assert out.shape == (4, 8)
    np.testing.assert_allclose(out.sum(axis=1), 1, rtol=1e-5)  # softmax rows


def test_arguments_copied_to_the_worker_are_charged_while_the_call_runs(isolated, tmp_path):
    """Arrays allocated before the session's worker started live outside the shared arena, so a call
    copies them to the worker and back: those copies count while the call runs (refused here: 24 MiB
    held + the worker + 3 x 24 MiB in flight).  The same arrays allocated after it cross as handles."""
    lib_path = build_c("c_target_kernels", tmp_path)
    sess = rpc.connect(isolated.host, isolated.port)
    dev = sess.cpu(0)
    n = 3 * MB  # floats: 12 MiB per array
    x = np.arange(n, dtype="float32")
    a, b = tvm.runtime.tensor(x, dev), tvm.runtime.empty((n,), "float32", dev)  # before the worker
    add_one = load(sess, lib_path)["add_one"]
    with pytest.raises(Exception, match=rf"arguments copied to the native worker needs {3 * 8 * n} bytes, "
                                        rf"beyond the session memory budget"):
        add_one(a, b)
    del a, b
    a, b = tvm.runtime.tensor(x, dev), tvm.runtime.empty((n,), "float32", dev)  # in the shared arena
    add_one(a, b)
    np.testing.assert_array_equal(b.numpy(), x + 1)


def test_worker_and_its_storage_are_charged_and_released(isolated, libs):
    sess = rpc.connect(isolated.host, isolated.port)
    start = used(sess)
    lib = load(sess, libs[FITS])
    with_worker = used(sess)
    assert with_worker - start >= WORKER_COST  # the worker process itself
    ex = run_graph(sess, lib, FITS)
    storage = used(sess) - with_worker
    assert 8 * FITS <= storage < 8 * FITS + MB  # its executor's storage, held in the worker
    del ex
    gc.collect()
    lib["add_one"]  # the next native request carries the freed executor to the worker
    assert used(sess) - with_worker < MB  # and its storage is released


def test_two_sessions_that_fit_alone_exceed_the_server_budget_together(isolated, libs):
    first = rpc.connect(isolated.host, isolated.port)
    first_ex = run_graph(first, load(first, libs[FITS]), FITS)  # worker + 40 MiB: under 96 alone
    second = rpc.connect(isolated.host, isolated.port)
    lib = load(second, libs[FITS])  # its worker still fits in the server's 128 MiB
    with pytest.raises(Exception, match=rf"graph executor storage needs {8 * FITS} bytes, beyond the server "
                                        rf"memory budget \(\d+ of {TOTAL_MB * MB} bytes in use\)"):
        lib["default"](second.cpu(0))
    del first_ex, first  # the first session ends (the client closes it when its last object goes) ...
    gc.collect()
    for _ in range(50):  # ... and the server sees the connection close on its own time
        try:
            run_graph(second, lib, FITS)  # now the server account has room: the first one gave it all back
            break
        except Exception as exc:
            assert "server memory budget" in str(exc)
            time.sleep(0.1)
    else:
        pytest.fail("the server account did not get back what the first session held")


def test_what_the_worker_really_holds_is_charged_and_given_back(libs):
    """Below the RPC layer: the session's ``NativeSession`` with a real account tree.  The worker's
    arena (its own bookkeeping, and the pages the memfd really holds) never exceeds what the account
    was charged for it; closing the worker, or its crash, gives everything back."""
    import os
    import signal

    from rpcsrv.board.accounts import MemoryAccount
    from rpcsrv.native.host import NativeSession
    from rpcsrv.protocol import Device

    server = MemoryAccount(TOTAL_MB * MB, name="server")
    for end in ("close", "crash"):
        account = MemoryAccount(SESSION_MB * MB, parent=server)
        native = NativeSession("isolated", SESSION_MB * MB)
        native.account = account
        lib = native.load(str(libs[FITS]))
        ex = lib.get_function("default")(Device(1, 0))
        x = native.zeros(4 * FITS).view("float32")  # a session buffer: in the arena both sides map
        x[:] = np.arange(FITS)
        ex.get_function("set_input")("x", x)
        ex.get_function("run")()  # every storage page is written: the memfd really holds them
        stats, _ = native.worker.request(("stats",), "stats")
        real = os.fstat(native.worker.worker_arena.fd).st_blocks * 512
        assert 8 * FITS <= stats["arena_used"] <= stats["held"] == native.worker.charged
        assert real <= stats["held"]
        assert account.used == server.used == WORKER_COST + stats["held"]
        with pytest.raises(Exception, match="graph executor storage needs .* beyond the session memory budget"):
            native.load(str(libs[BIG])).get_function("default")(Device(1, 0))
        assert account.used == WORKER_COST + stats["held"]  # the refused one took nothing
        if end == "crash":
            os.kill(native.worker.pid, signal.SIGKILL)
            with pytest.raises(Exception, match="native code crashed"):
                ex.get_function("run")()
        else:
            native.close()
        assert account.used == server.used == 0
        native.close()


def test_worker_budget_checks_against_every_account_and_counts_what_is_unreported():
    """The worker's hook (no process): each account of the chain is checked with what the worker grew
    since the session last charged it; a refusal keeps its numbers through an executor's own error;
    a returned array outside the arenas is checked before it is copied out."""
    from rpcsrv.native.budget import OverBudget, WorkerBudget, refusal_in
    from rpcsrv.native.worker import WorkerState

    budget = WorkerBudget()
    budget.grant((0, (("session", 10, 100), ("server", 50, 120))))
    first, second = np.zeros(1), np.zeros(1)
    budget.charge(first, 60, "graph executor storage")
    assert budget.held == 60
    with pytest.raises(OverBudget) as info:
        budget.charge(second, 40, "VM storage")  # 10 + 60 unreported + 40 > 100
    assert info.value.args == ("VM storage", 40, "session", 70, 100)
    budget.grant((60, (("session", 70, 100), ("server", 110, 120))))  # the session charged the 60
    with pytest.raises(OverBudget, match="server"):
        budget.charge(second, 20, "VM storage")
    del first
    gc.collect()
    assert budget.held == 0  # released with its owner
    try:
        try:
            budget.charge(second, 200, "VM storage")
        except OverBudget:
            raise RuntimeError("main: instruction 10 (vm.builtin.alloc_storage): OverBudget") from None
    except RuntimeError as wrapped:
        assert refusal_in(wrapped).args[0] == "VM storage"
    assert refusal_in(ValueError("unrelated")) is None

    state = WorkerState(None, None)
    state.budget.grant((0, (("session", 0, 1000),)))
    with pytest.raises(OverBudget, match="returned array"):
        state.to_wire(np.zeros(2000, np.uint8))
    assert state.to_wire(np.zeros(100, np.uint8)).array.nbytes == 100
