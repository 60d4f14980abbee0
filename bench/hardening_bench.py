"""Hardening figures (issue 11), run by hand against a fresh ``rpcsrv serve``:

    python bench/hardening_bench.py [claims] [soak] [latency] [--cycles 10000 --sessions 1000 --busy 16]

* ``claims``: four connections each claim a 1 GiB packet and send 520 bytes; the server's resident
  size before and after, and how long other clients' handshakes (connect + kInitServer) take
  meanwhile (max and p99 of 200; target: +64 MB at most, 100 ms at most);
* ``soak``: ``--cycles`` alloc/free cycles in one session, then ``--sessions`` sessions opened, used
  and closed one after another; resident size at the start, after warm-up and at the end (target:
  stable);
* ``latency``: ``--busy`` sessions (one client process each) run inference in a loop (a chain of
  256x256 matrix products, ~20-40 ms a run) while an idle session makes small calls
  (``workpath``): p50/p99/max of those calls (target: p99 <= 10 ms).

Figures depend on the machine and its load: on a shared 2-core box they are upper bounds.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "executor"))

from rpcsrv.client import rpc  # noqa: E402
from rpcsrv.protocol import RPC_MAGIC, RPCCode  # noqa: E402

MB = 1 << 20


def start_server(*args: str):
    work = tempfile.mkdtemp(prefix="hardening-bench-")
    proc = subprocess.Popen([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", "--workdir", work, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    port = int(re.search(r":(\d+)", proc.stdout.readline()).group(1))
    return proc, port


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def _raw_session(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(struct.pack("<ii", RPC_MAGIC, 7) + b"client:")
    s.recv(64)
    body = struct.pack("<iQ", RPCCode.INIT_SERVER, 5) + b"0.8.0" + struct.pack("<i", 0)
    s.sendall(struct.pack("<q", len(body)) + body)
    s.recv(64)
    return s


def claims() -> None:
    proc, port = start_server()
    try:
        with rpc.connect("127.0.0.1", port) as warm:
            warm.listdir(".")
        time.sleep(0.5)
        before = rss_mb(proc.pid)
        attackers, times = [], []
        for i in range(200):
            if i % 50 == 0 and len(attackers) < 4:
                s = _raw_session(port)
                s.sendall(struct.pack("<qi", 1 << 30, RPCCode.CALL_FUNC) + b"\x01" * 516)
                attackers.append(s)
            t = time.perf_counter()
            with rpc.connect("127.0.0.1", port) as sess:
                pass
            times.append(time.perf_counter() - t)
            del sess
        time.sleep(0.5)
        after = rss_mb(proc.pid)
        print(f"claims: 4 x 1 GiB claimed: RSS {before:.0f} -> {after:.0f} MB (+{after - before:.0f} MB); "
              f"200 other sessions opened meanwhile: p50 {pct(times, 50):.1f} ms, p99 {pct(times, 99):.1f} ms, "
              f"max {max(times) * 1e3:.1f} ms")
        for s in attackers:
            s.close()
    finally:
        proc.kill()


def soak(cycles: int, sessions: int) -> None:
    proc, port = start_server()
    try:
        marks = [("start", rss_mb(proc.pid))]
        with rpc.connect("127.0.0.1", port) as sess:
            f = sess.get_function("tvm.rpc.server.workpath")
            for i in range(cycles):
                arr = sess.empty((64 * 1024,), "float32")  # 256 KiB
                arr.copyfrom(np.ones(64 * 1024, np.float32))
                del arr
                if i == min(1000, cycles // 10):
                    gc.collect()
                    f("x")
                    marks.append((f"after {i} alloc/free", rss_mb(proc.pid)))
            gc.collect()
            f("x")
        marks.append((f"after {cycles} alloc/free", rss_mb(proc.pid)))
        for i in range(sessions):
            with rpc.connect("127.0.0.1", port) as s:
                a = s.empty((16 * 1024,), "float32")
                s.upload(b"x" * 4096, "f.bin")
                del a
            if i == min(100, sessions // 10):
                marks.append((f"after {i} sessions", rss_mb(proc.pid)))
        time.sleep(0.5)
        marks.append((f"after {sessions} sessions", rss_mb(proc.pid)))
        print("soak: RSS " + ", ".join(f"{name} {mb:.0f} MB" for name, mb in marks))
    finally:
        proc.kill()


def _busy(port: int, path: str, stop, ready) -> None:
    from rpcsrv.client.graph_executor import GraphModule

    sess = rpc.connect("127.0.0.1", port)
    sess.upload(path, "busy.blob")
    gmod = GraphModule(sess.load_module("busy.blob")["default"](sess.cpu(0)))
    gmod.set_input("x", np.full((256, 256), 1e-3, np.float32))
    gmod.run()
    ready.release()
    while not stop.is_set():
        gmod.run()
    sess.close()


def _busy_library(path: Path) -> Path:
    from exec_helpers import GraphBuilder

    from rpcsrv.loader import (ConstLoaderModule, ExampleJSONModule, GraphExecutorFactoryModule, HostLibraryModule,
                               build_blob)

    n, steps = 256, 40
    lines = ["busy_0", f"  input 0 {n} {n}"] + [f"  matmul {k} inputs: {k - 1} 0 shape: {n} {n}"
                                                 for k in range(1, steps + 1)]
    g = GraphBuilder()
    out = g.op("busy_0", [g.input("x", (n, n))], [((n, n), "float32")])
    tree = GraphExecutorFactoryModule(graph_json=g.json([out]), params={}, module_name="default", imports=[
        HostLibraryModule(symbols=[], imports=[ConstLoaderModule({}, {"busy_0": []}, imports=[
            ExampleJSONModule(code="\n".join(lines) + "\n")])])])
    blob = build_blob(tree)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob)
    return path


def latency(busy: int, calls: int, server_args: list[str]) -> None:
    proc, port = start_server(*server_args)
    try:
        lib = _busy_library(Path(tempfile.mkdtemp()) / "busy.blob")
        ctx = multiprocessing.get_context("spawn")
        stop, ready = ctx.Event(), ctx.Semaphore(0)
        workers = [ctx.Process(target=_busy, args=(port, str(lib), stop, ready)) for _ in range(busy)]
        for w in workers:
            w.start()
        for _ in workers:
            ready.acquire(timeout=120)
        with rpc.connect("127.0.0.1", port) as idle:
            f = idle.get_function("tvm.rpc.server.workpath")
            times = []
            for _ in range(calls):
                t = time.perf_counter()
                f("x")
                times.append(time.perf_counter() - t)
                time.sleep(0.002)
        stop.set()
        for w in workers:
            w.join(60)
        print(f"latency {' '.join(server_args)}: small calls of an idle session while {busy} sessions run inference: "
              f"p50 {pct(times, 50):.2f} ms, p99 {pct(times, 99):.2f} ms, max {max(times) * 1e3:.2f} ms "
              f"({calls} calls)")
    finally:
        proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", default=["claims", "soak", "latency"])
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--busy", type=int, default=16)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--server-args", default="", help="extra rpcsrv serve flags, e.g. '--max-threads 2'")
    args = ap.parse_args()
    for part in args.parts:
        if part == "claims":
            claims()
        elif part == "soak":
            soak(args.cycles, args.sessions)
        elif part == "latency":
            latency(args.busy, args.calls, args.server_args.split())
        else:
            ap.error(f"unknown part {part!r}")


if __name__ == "__main__":
    main()
