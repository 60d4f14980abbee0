"""RPC benchmark: rpcsrv against TVM's own RPC server, driven by the real TVM client.

    python bench/rpc_bench.py [--size-mb 64] [--calls 300] [--repeat 3]

Measures, on loopback:
  * small-call round trip (``tvm.rpc.server.workpath("x")``), microseconds per call;
  * copy to remote, copy from remote and upload of ``--size-mb`` MB, MB/s (best of ``--repeat``);
for (a) the TVM client against ``python -m tvm.exec.rpc_server`` (the anchor), (b) the TVM client
against ``rpcsrv serve``, (c) our pure-Python client against rpcsrv, (d) a raw loopback socket moving
the same bytes.  Prints the figures and the ratios the project targets:
round trip rpcsrv/TVM <= 1.5x; TVM-client throughput rpcsrv/TVM >= 1.5x; our client >= 50% of raw.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def start(cmd: list[str], pattern: str, timeout: float = 60.0) -> tuple[subprocess.Popen, int]:
    """Start a server process and return it with the port it reports."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: workers die with it
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
            return proc, int(m.group(1))
    proc.kill()
    raise RuntimeError(f"{cmd[:4]} did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(sess, make_array, calls: int, nbytes: int, repeat: int) -> dict[str, float]:
    """Round trip (us/call) and MB/s for copy to / copy from / upload, for any tvm.rpc-shaped session."""
    f = sess.get_function("tvm.rpc.server.workpath")
    f("x")
    t0 = time.perf_counter()
    for _ in range(calls):
        f("x")
    rt = (time.perf_counter() - t0) / calls * 1e6
    x = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    arr = make_array(x)
    mb = nbytes / 1e6
    to = mb / best(lambda: arr.copyfrom(x), repeat)
    frm = mb / best(lambda: arr.numpy(), repeat)
    np.testing.assert_array_equal(arr.numpy(), x)
    blob = bytearray(x.tobytes())
    up = mb / best(lambda: sess.upload(blob, "bench.bin"), repeat)
    sess.remove("bench.bin")
    return {"round trip us": rt, "copy to MB/s": to, "copy from MB/s": frm, "upload MB/s": up}


def raw_socket(nbytes: int, repeat: int) -> float:
    """MB/s of one loopback TCP connection moving nbytes and waiting for a 1-byte ack."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def sink():
        conn, _ = srv.accept()
        buf = bytearray(1 << 20)
        for _ in range(repeat):
            got = 0
            while got < nbytes:
                got += conn.recv_into(buf)
            conn.sendall(b"k")
        conn.close()

    th = threading.Thread(target=sink, daemon=True)
    th.start()
    c = socket.create_connection(("127.0.0.1", port))
    data = bytes(nbytes)

    def once():
        c.sendall(data)
        c.recv(1)
    rate = nbytes / 1e6 / best(once, repeat)
    c.close()
    th.join()
    srv.close()
    return rate


def run(size_mb: int, calls: int, repeat: int, with_tvm_server: bool = True) -> dict[str, dict]:
    import tvm

    from client import rpc as our_rpc

    nbytes = size_mb << 20
    results: dict[str, dict] = {}
    procs = []
    try:
        ours, ours_port = start([sys.executable, "-m", "rpcsrv", "serve", "--port", "0"], r":(\d+)")
        procs.append(ours)
        if with_tvm_server:
            p0 = free_port()
            theirs, theirs_port = start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                                         "--port", str(p0), "--port-end", str(p0 + 50)], r"bind to [\d.]+:(\d+)")
            procs.append(theirs)
            time.sleep(0.5)
            s = tvm.rpc.connect("127.0.0.1", theirs_port)
            results["TVM client -> TVM server"] = measure(
                s, lambda x: tvm.runtime.tensor(x, s.cpu(0)), calls, nbytes, repeat)
        s = tvm.rpc.connect("127.0.0.1", ours_port)
        results["TVM client -> rpcsrv"] = measure(
            s, lambda x: tvm.runtime.tensor(x, s.cpu(0)), calls, nbytes, repeat)
        s2 = our_rpc.connect("127.0.0.1", ours_port)
        results["our client -> rpcsrv"] = measure(s2, lambda x: s2.array(x), calls, nbytes, repeat)
        s2.close()
        results["raw loopback socket"] = {"copy to MB/s": raw_socket(nbytes, repeat)}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            p.wait(10)
    return results


def report(results: dict[str, dict]) -> str:
    cols = ["round trip us", "copy to MB/s", "copy from MB/s", "upload MB/s"]
    lines = [f"{'':28s}" + "".join(f"{c:>16s}" for c in cols)]
    for name, row in results.items():
        lines.append(f"{name:28s}" + "".join(f"{row[c]:16.1f}" if c in row else f"{'-':>16s}" for c in cols))
    t, o, c = (results.get(k) for k in ("TVM client -> TVM server", "TVM client -> rpcsrv", "our client -> rpcsrv"))
    raw = results["raw loopback socket"]["copy to MB/s"]
    if t:
        lines.append(f"round trip rpcsrv/TVM: {o['round trip us'] / t['round trip us']:.2f}x (target <= 1.5x)")
        for col in cols[1:]:
            lines.append(f"{col} rpcsrv/TVM server (TVM client): {o[col] / t[col]:.2f}x (target >= 1.5x)")
    for col in ("copy to MB/s", "copy from MB/s", "upload MB/s"):
        lines.append(f"{col} our client / raw socket: {c[col] / raw:.0%} (target >= 50%)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-tvm-server", action="store_true", help="skip the TVM server anchor")
    args = ap.parse_args(argv)
    print(report(run(args.size_mb, args.calls, args.repeat, not args.no_tvm_server)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
