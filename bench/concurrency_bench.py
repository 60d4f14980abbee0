"""Throughput under concurrent sessions (issue 16): K sessions run a shufflenet over RPC, one idle session
makes small calls meanwhile.

A fresh ``rpcsrv serve`` gets the light zoo's shufflenet (compiled by ``client.compile_onnx``, its weight
fills made initializers).  For each K (``--sessions 1,2,4,16,32``) K client threads (our client,
``rpcsrv.client.rpc``; each its own connection and session, own module and executor) run the model in a loop for
``--seconds``, while one more session calls ``tvm.rpc.server.workpath`` every 2 ms.  Printed per K:
aggregate runs/s, its ratio to K=1, and the small calls' p50/p99/max.  Each session first runs its model past
the runs in which its executor learns its BLAS thread count (``compute.ThreadChoice``): 32 executors learning
at once took most of a 5 s window (K=32: 0.79x of K=1 in 5 s, 1.04x in 12 s).  A first row runs K=1 on a server
pinned to one BLAS thread per run (``RPCSRV_BLAS_THREADS=1``): the single-thread rate, of which the
target for K >= cores is close to cores x.

``--isolate`` is passed to the server (default ``auto``, the server's own default: a session that loads
while another computes in the server gets a worker process of its own); ``all``: every session computes
in a worker process of its own; ``native``: every session in the server, sharing its interpreter lock.
Runs in workers take the server's compute slots.

With ``--rounds R`` every K is measured R times, in alternating order, and the medians are printed: the
host's speed drifts by 10-25% within a minute, so K=1 measured once, first, is no steady reference.

    python bench/concurrency_bench.py [--sessions 1,2,4,16,32] [--seconds 3] [--rounds 3] [--isolate auto|native|all]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rpcsrv.client import rpc  # noqa: E402


def start_server(env: dict | None = None, extra: tuple = ()):
    work = tempfile.mkdtemp(prefix="concurrency-bench-")
    proc = subprocess.Popen([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", "--workdir", work, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            env={**os.environ, **(env or {})})
    port = int(re.search(r":(\d+)", proc.stdout.readline()).group(1))
    return proc, port


def build_library(path: Path) -> tuple[Path, str, tuple]:
    import onnx

    from rpcsrv.client import compile_onnx
    from zoo_bench import LIGHT, feeds_of, fills_as_initializers

    model = fills_as_initializers(onnx.load(str(LIGHT / "light_shufflenet.onnx")))
    compile_onnx(model).export_library(str(path))
    ((name, x),) = feeds_of(model).items()
    return path, name, x


def _worker(port, lib, name, x, stop: threading.Event, ready: threading.Barrier, counts: list, k: int):
    from rpcsrv.client.graph_executor import GraphModule

    with rpc.connect("127.0.0.1", port) as sess:
        sess.upload(str(lib), lib.name)
        gmod = GraphModule(sess.load_module(lib.name)["default"](sess.cpu(0)))
        gmod.set_input(name, x)
        from rpcsrv.executor.compute import ThreadChoice

        for _ in range(2 + 2 * ThreadChoice.TRIALS):  # the steady state: past the executor's thread-count trials
            gmod.run()
        ready.wait(timeout=300)
        while not stop.is_set():
            gmod.run()
            counts[k] += 1


def measure(port: int, lib: Path, name: str, x: np.ndarray, k: int, seconds: float) -> dict:
    stop, ready = threading.Event(), threading.Barrier(k + 1)
    counts = [0] * k
    threads = [threading.Thread(target=_worker, args=(port, lib, name, x, stop, ready, counts, i), daemon=True)
               for i in range(k)]
    for t in threads:
        t.start()
    ready.wait(timeout=300)
    begin, start_counts = time.perf_counter(), sum(counts)
    small = []
    with rpc.connect("127.0.0.1", port) as idle:
        f = idle.get_function("tvm.rpc.server.workpath")
        while time.perf_counter() - begin < seconds:
            t = time.perf_counter()
            f("x")
            small.append(time.perf_counter() - t)
            time.sleep(0.002)
    runs, elapsed = sum(counts) - start_counts, time.perf_counter() - begin
    stop.set()
    for t in threads:
        t.join(60)
    ms = np.asarray(small) * 1e3
    return {"K": k, "runs_per_s": runs / elapsed, "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)), "max": float(ms.max()), "calls": len(small)}


def _median_row(rows: list[dict]) -> dict:
    """The median of each figure over the rounds of one K."""
    return {key: (rows[0][key] if key == "K" else float(np.median([r[key] for r in rows]))) for key in rows[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", default="1,2,4,16,32")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3, help="measure every K this many times (medians printed)")
    ap.add_argument("--isolate", choices=["native", "all", "auto"], default="auto",
                    help="the server's --isolate (default auto, as the server's): all = every session computes "
                         "in its own worker process; auto = those that load while another computes in the "
                         "server; native = all in the server")
    args = ap.parse_args(argv)
    extra = ("--isolate", args.isolate)
    from rpcsrv.executor.compute import CORES

    lib, name, x = build_library(Path(tempfile.mkdtemp()) / "shufflenet.so")
    rows = []
    proc, port = start_server({"RPCSRV_BLAS_THREADS": "1"}, extra)
    try:
        single = measure(port, lib, name, x, 1, args.seconds)
    finally:
        proc.kill()
    ks = [int(v) for v in args.sessions.split(",")]
    proc, port = start_server(extra=extra)
    try:
        for r in range(args.rounds):  # rounds in alternating order: the machine's speed drifts over minutes
            for k in (ks if r % 2 == 0 else ks[::-1]):
                rows.append(measure(port, lib, name, x, k, args.seconds))
                print(rows[-1], file=sys.stderr, flush=True)
    finally:
        proc.kill()
    rows = [_median_row([row for row in rows if row["K"] == k]) for k in ks]
    base = rows[0]["runs_per_s"] if rows else 1.0
    print(f"shufflenet over RPC, our client, --isolate {args.isolate}, {CORES} cores, {args.seconds:g} s per K"
          f"{f', median of {args.rounds} rounds' if args.rounds > 1 else ''}; "
          f"single-thread rate "
          f"(K=1, 1 BLAS thread) {single['runs_per_s']:.1f} runs/s, cores x that {CORES * single['runs_per_s']:.1f}")
    print("| K | runs/s | vs K=1 | small call p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['K']} | {r['runs_per_s']:.1f} | {r['runs_per_s'] / base:.2f}x | {r['p50']:.2f} | "
              f"{r['p99']:.2f} | {r['max']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
