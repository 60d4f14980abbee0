"""Many sessions at once: 32 clients, each in its own session and thread, run the same
uploaded model 100 times on inputs of their own; every output must be that client's answer, and each
session's handles stay its own (a handle from one session is unknown in another)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from rpcsrv.client import rpc
from rpcsrv.client.graph_executor import GraphModule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))

from exec_helpers import GraphBuilder  # noqa: E402
from rpcsrv.loader import (ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule,  # noqa: E402
                           HostLibraryModule, build_blob)

N = 64
SESSIONS = 32
RUNS = 100


def seed_library(path: Path) -> Path:
    """The BYOC guide's subgraph, ``(a + b - c) * d`` on 64 float32s, as one ExampleJSON function."""
    ej = ExampleJSONModule(code=(f"f_0\n  input 0 {N}\n  input 1 {N}\n  input 2 {N}\n  input 3 {N}\n"
                                 f"  add 4 inputs: 0 1 shape: {N}\n  sub 5 inputs: 4 2 shape: {N}\n"
                                 f"  mul 6 inputs: 5 3 shape: {N}\n"))
    g = GraphBuilder()
    xs = [g.input(f"x{i}", (N,)) for i in range(4)]
    out = g.op("f_0", xs, [((N,), "float32")])
    tree = GraphExecutorFactoryModule(graph_json=g.json([out]), params={}, module_name="default", imports=[
        HostLibraryModule(symbols=[], imports=[ConstLoaderModule({}, {"f_0": []}, imports=[ej])])])
    blob = build_blob(tree)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob)
    return path


def one_client(server, lib: Path, seed: int, problems: list, handles: list, start: threading.Barrier):
    try:
        with rpc.connect(server.host, server.port) as sess:
            sess.upload(str(lib))
            m = GraphModule(sess.load_module(lib.name)["default"](sess.cpu(0)))
            handles.append((seed, m))
            start.wait(60)  # every session open before anyone runs: they really overlap
            rng = np.random.default_rng(seed)
            for run in range(RUNS):
                xs = [rng.standard_normal(N).astype("float32") for _ in range(4)]
                m.run(**{f"x{i}": x for i, x in enumerate(xs)})
                got = m.get_output(0).numpy()
                want = (xs[0] + xs[1] - xs[2]) * xs[3]
                if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
                    problems.append(f"session {seed}, run {run}: wrong output")
                    return
            start.wait(60)  # and still open while the others check their handles
    except Exception as exc:  # noqa: BLE001 - reported by the test
        problems.append(f"session {seed}: {type(exc).__name__}: {exc}")
        start.abort()


@pytest.mark.slow
def test_32_sessions_run_100_times_each_with_correct_outputs(server, tmp_path):
    lib = seed_library(tmp_path / "seed.blob")
    problems: list[str] = []
    handles: list = []
    start = threading.Barrier(SESSIONS)
    threads = [threading.Thread(target=one_client, args=(server, lib, s, problems, handles, start))
               for s in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not any(t.is_alive() for t in threads), "a session hung"
    assert problems == []
    assert server.alive()


def test_a_session_handle_is_unknown_in_another(server, tmp_path):
    lib = seed_library(tmp_path / "seed.blob")
    with rpc.connect(server.host, server.port) as a, rpc.connect(server.host, server.port) as b:
        a.upload(str(lib))
        run_a = a.load_module(lib.name)["default"](a.cpu(0))["run"]
        # a's function handle, called in b's session: b's table does not know it
        foreign = rpc.RemoteFunction(b, run_a.handle)
        with pytest.raises(rpc.RPCError, match="unknown"):
            foreign()
        run_a()  # and a's session still works
