"""A long inference in one session does not stall the others: kernels run in a worker thread, so the
event loop keeps answering other clients' small calls while one client's ``run`` computes."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

from rpcsrv.client import rpc
from rpcsrv.client.graph_executor import GraphModule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "executor"))

from exec_helpers import GraphBuilder  # noqa: E402
from rpcsrv.loader import (ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule,  # noqa: E402
                           HostLibraryModule, build_blob)

N = 768
STEPS = 60


def slow_library(path: Path) -> Path:
    """A raw-blob library whose one subgraph is a chain of STEPS (N x N) matrix products."""
    lines = ["slow_0", f"  input 0 {N} {N}"]
    lines += [f"  matmul {k} inputs: {k - 1} 0 shape: {N} {N}" for k in range(1, STEPS + 1)]
    ej = ExampleJSONModule(code="\n".join(lines) + "\n")
    g = GraphBuilder()
    x = g.input("x", (N, N))
    out = g.op("slow_0", [x], [((N, N), "float32")])
    tree = GraphExecutorFactoryModule(graph_json=g.json([out]), params={}, module_name="default", imports=[
        HostLibraryModule(symbols=[], imports=[ConstLoaderModule({}, {"slow_0": []}, imports=[ej])])])
    blob = build_blob(tree)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob)
    return path


def test_small_calls_are_answered_during_a_long_run(server, tmp_path):
    busy = rpc.connect(server.host, server.port)
    busy.upload(str(slow_library(tmp_path / "slow.blob")))
    gmod = GraphModule(busy.load_module("slow.blob")["default"](busy.cpu(0)))
    gmod.set_input("x", np.full((N, N), 1e-3, np.float32))

    run_time = []

    def long_run():
        start = time.perf_counter()
        gmod.run()
        run_time.append(time.perf_counter() - start)

    other = rpc.connect(server.host, server.port)
    f = other.get_function("tvm.rpc.server.workpath")
    worker = threading.Thread(target=long_run)
    worker.start()
    time.sleep(0.05)  # the run is under way
    latencies = []
    while worker.is_alive() and len(latencies) < 200:
        start = time.perf_counter()
        f("x")
        latencies.append(time.perf_counter() - start)
        time.sleep(0.002)
    worker.join()
    assert run_time and run_time[0] > 0.2, f"the run took {run_time}: too short to overlap"
    assert len(latencies) >= 10, "no small call was made while the run computed"
    worst = max(latencies)
    assert worst < min(0.1, run_time[0] / 4), \
        f"a small call waited {worst * 1e3:.0f} ms during a {run_time[0] * 1e3:.0f} ms run"
