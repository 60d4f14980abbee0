"""RPC benchmark: rpcsrv against TVM's own RPC server, driven by the real TVM client.

    python bench/rpc_bench.py [--size-mb 64] [--calls 1000] [--rounds 7] [--repeat 3]

Measures, on loopback:
  * small-call round trip (``tvm.rpc.server.workpath("x")``), microseconds per call: the median over
    every call of ``--rounds`` rounds of ``--calls`` calls, the servers taking turns round by round, in two CPU
    placements: client and servers pinned to one CPU (each call costs what client and server compute:
    the processing cost) and to two different CPUs (a wake-up crosses CPUs on every call, as between
    two machines).  Left to the scheduler, a figure swings between the two regimes from run to run;
  * copy to remote, copy from remote and upload of ``--size-mb`` MB, MB/s (best of ``--repeat`` turns,
    the sessions taking turns within each), and
    for the TVM client how busy the client process itself was meanwhile (its CPU time / wall time:
    near 100% means the client, not the server, sets the pace);
for (a) the TVM client against ``python -m tvm.exec.rpc_server`` (the anchor), (b) the TVM client
against ``rpcsrv serve``, (c) our pure-Python client against rpcsrv, (d) a raw loopback socket moving
the same bytes.  Then the server's own path of one small call, layer by layer (``rpc_layers.py``; with
``--baseline SRC`` also for that checkout, the two taking turns).  Prints the figures and the ratios
the project targets:
round trip rpcsrv/TVM <= 0.6x; TVM-client throughput rpcsrv/TVM >= 1.5x; our client >= 50% of raw.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def start(cmd: list[str], pattern: str, timeout: float = 60.0) -> tuple[subprocess.Popen, int]:
    """Start a server process and return it with the port it reports."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: workers die with it
    deadline = time.time() + timeout
    said: list[str] = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        said.append(line)
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
            return proc, int(m.group(1))
    proc.kill()
    status = proc.wait()
    # the server's own words (e.g. TVM's server missing ``cloudpickle``), not just "did not start"
    last = "".join(said[-15:]).strip() or "(no output)"
    raise RuntimeError(f"{' '.join(cmd[:4])} did not start (exit status {status}); it said:\n{last}")


def stop(procs: list[subprocess.Popen]) -> None:
    """End servers started by :func:`start`, each with its process group (its native workers)."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        p.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def best(fn, repeat: int) -> tuple[float, float]:
    """(fastest wall time, this process's CPU time / wall time in that run)."""
    runs = []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = time.perf_counter() - t0
        runs.append((wall, (time.process_time() - c0) / wall))
    return min(runs)


def pin(pgids: list[int], server_cpus: set[int], client_cpus: set[int]) -> None:
    """Pin this thread to ``client_cpus`` and every process of the servers' groups to ``server_cpus``."""
    os.sched_setaffinity(0, client_cpus)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) in pgids:
                    for task in os.listdir(f"/proc/{entry}/task"):
                        os.sched_setaffinity(int(task), server_cpus)
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                pass


def round_trips(sessions: dict, calls: int, rounds: int) -> dict[str, float]:
    """Microseconds per small call for each session, the sessions taking turns per round: the median
    over every call of every round (a median per call, so that calls another process preempted on
    this shared machine do not count)."""
    funcs = {name: s.get_function("tvm.rpc.server.workpath") for name, s in sessions.items()}
    per_call: dict[str, list[float]] = {name: [] for name in sessions}
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for name, f in funcs.items():
            f("x")
            times = per_call[name]
            for _ in range(calls):
                t0 = clock()
                f("x")
                times.append(clock() - t0)
    return {name: float(np.median(v)) / 1e3 for name, v in per_call.items()}


def measure(sessions: dict, makers: dict, nbytes: int, repeat: int) -> dict[str, dict[str, float]]:
    """MB/s for copy to / copy from / upload (and the client's busy share) for each tvm.rpc-shaped
    session: the best of ``repeat`` turns, the sessions taking turns within each (paired runs)."""
    x = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    arrays = {name: makers[name](x) for name in sessions}
    mb = nbytes / 1e6
    blob = bytearray(x.tobytes())
    runs: dict[str, dict[str, list]] = {name: {} for name in sessions}
    for _ in range(repeat):
        for name, sess in sessions.items():
            arr = arrays[name]
            for col, fn in (("copy to", lambda: arr.copyfrom(x)), ("copy from", lambda: arr.numpy()),
                            ("upload", lambda: sess.upload(blob, "bench.bin"))):
                runs[name].setdefault(col, []).append(best(fn, 1))
    out = {}
    for name, sess in sessions.items():
        np.testing.assert_array_equal(arrays[name].numpy(), x)
        sess.remove("bench.bin")
        row = out[name] = {}
        for col, walls in runs[name].items():
            wall, busy = min(walls)
            row[f"{col} MB/s"] = mb / wall
            row[f"{col} client busy"] = busy
    return out


def raw_socket(nbytes: int, repeat: int, to_file: bool = False) -> float:
    """MB/s of one loopback TCP connection moving nbytes and waiting for a 1-byte ack; ``to_file``:
    the receiver also writes what it gets to a file, 1 MB at a time (what an upload must do)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def sink():
        conn, _ = srv.accept()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        for _ in range(repeat):
            got = 0
            with tempfile.TemporaryFile() if to_file else contextlib.nullcontext() as f:
                while got < nbytes:
                    n = conn.recv_into(buf)
                    if f:
                        f.write(view[:n])
                    got += n
            conn.sendall(b"k")
        conn.close()

    th = threading.Thread(target=sink, daemon=True)
    th.start()
    c = socket.create_connection(("127.0.0.1", port))
    data = bytes(nbytes)

    def once():
        c.sendall(data)
        c.recv(1)
    rate = nbytes / 1e6 / best(once, repeat)[0]
    c.close()
    th.join()
    srv.close()
    return rate


BASELINE = "TVM client -> rpcsrv (base)"
OUR_BASELINE = "our client -> rpcsrv (base)"


def run(size_mb: int, calls: int, repeat: int, with_tvm_server: bool = True, rounds: int = 7,
        baseline: str | None = None, transfers: bool = True) -> dict[str, dict]:
    import tvm

    from rpcsrv.client import rpc as our_rpc

    nbytes = size_mb << 20
    results: dict[str, dict] = {}
    sessions: dict = {}
    procs = []
    try:
        ours, ours_port = start([sys.executable, "-m", "rpcsrv", "serve", "--port", "0"], r":(\d+)")
        procs.append(ours)
        if baseline:  # the same server from another checkout (an older commit), in the same rounds
            base, base_port = start([sys.executable, "-c", f"import sys; sys.path.insert(0, {baseline!r}); "
                                     "from rpcsrv.cli import main; sys.exit(main())", "serve", "--port", "0"],
                                    r":(\d+)")
            procs.append(base)
        if with_tvm_server:
            p0 = free_port()
            theirs, theirs_port = start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                                         "--port", str(p0), "--port-end", str(p0 + 50)], r"bind to [\d.]+:(\d+)")
            procs.append(theirs)
            time.sleep(0.5)
            sessions["TVM client -> TVM server"] = tvm.rpc.connect("127.0.0.1", theirs_port)
        sessions["TVM client -> rpcsrv"] = tvm.rpc.connect("127.0.0.1", ours_port)
        if baseline:
            sessions[BASELINE] = tvm.rpc.connect("127.0.0.1", base_port)
        ours_client = sessions["our client -> rpcsrv"] = our_rpc.connect("127.0.0.1", ours_port)
        if baseline:
            sessions[OUR_BASELINE] = our_rpc.connect("127.0.0.1", base_port)
        results = {name: {} for name in sessions}
        everywhere = os.sched_getaffinity(0)
        cpu = min(everywhere)
        other = min(everywhere - {cpu}, default=cpu)
        for label, server_cpus in (("1 CPU", {cpu}), ("2 CPUs", {other})):
            pin([p.pid for p in procs], server_cpus, {cpu})
            for name, rt in round_trips(sessions, calls, rounds).items():
                results[name][f"round trip us {label}"] = rt
        pin([p.pid for p in procs], everywhere, everywhere)
        if transfers:
            makers = {name: (lambda x, s=s: s.array(x)) if name.startswith("our client") else
                      (lambda x, s=s: tvm.runtime.tensor(x, s.cpu(0))) for name, s in sessions.items()}
            for name, row in measure(sessions, makers, nbytes, repeat).items():
                results[name].update(row)
        ours_client.close()
        if baseline:
            sessions[OUR_BASELINE].close()
        if transfers:
            results["raw loopback socket"] = {"copy to MB/s": raw_socket(nbytes, repeat)}
            results["raw socket into a file"] = {"upload MB/s": raw_socket(nbytes, repeat, to_file=True)}
    finally:
        stop(procs)
    return results


def report(results: dict[str, dict]) -> str:
    rts = ["round trip us 1 CPU", "round trip us 2 CPUs"]
    cols = rts + ["copy to MB/s", "copy from MB/s", "upload MB/s"]
    lines = [f"{'':28s}" + "".join(f"{c[:-6] if c in rts else '':>16s}" for c in cols),
             f"{'':28s}" + "".join(f"{c[-6:] if c in rts else c:>16s}" for c in cols)]
    for name, row in results.items():
        lines.append(f"{name:28s}" + "".join(f"{row[c]:16.1f}" if c in row else f"{'-':>16s}" for c in cols))
    busy = [c.replace("MB/s", "client busy") for c in cols[2:]]
    for name, row in results.items():  # the client's own CPU share of each transfer
        if busy[0] in row:
            lines.append(f"{'  client CPU/wall':28s}{'':32s}" + "".join(f"{row[c]:16.0%}" for c in busy)
                         + f"   ({name})")
    t, o, c = (results.get(k) for k in ("TVM client -> TVM server", "TVM client -> rpcsrv", "our client -> rpcsrv"))
    b = results.get(BASELINE)
    if t:
        for col in rts:
            lines.append(f"{col.replace('us ', '')} rpcsrv/TVM: {o[col] / t[col]:.2f}x (target <= 0.6x)"
                         + (f"; base/TVM: {b[col] / t[col]:.2f}x" if b else ""))
        for col in cols[2:]:
            if col in o:
                lines.append(f"{col} rpcsrv/TVM server (TVM client): {o[col] / t[col]:.2f}x (target >= 1.5x)"
                             + (f"; base/TVM: {b[col] / t[col]:.2f}x" if b else ""))
    ob = results.get(OUR_BASELINE)
    if ob and "copy to MB/s" in ob:
        for col in cols[2:]:
            lines.append(f"{col} our client, rpcsrv now / base: {c[col] / ob[col]:.2f}x")
    raw = results.get("raw loopback socket", {}).get("copy to MB/s")
    if raw:
        for col in ("copy to MB/s", "copy from MB/s", "upload MB/s"):
            lines.append(f"{col} our client / raw socket: {c[col] / raw:.0%} (target >= 50%)")
        into_file = results["raw socket into a file"]["upload MB/s"]
        lines.append(f"upload MB/s our client / raw socket into a file: {c['upload MB/s'] / into_file:.0%} "
                     f"(an upload also writes the file)")
    return "\n".join(lines)


def layers(baseline: str | None, turns: int = 3) -> str:
    """The per-layer breakdown (rpc_layers.py in subprocesses), medians over ``turns`` turns; with a
    baseline checkout, the two alternate turn by turn."""
    import json
    import statistics

    from rpc_layers import LAYERS

    srcs = {"now": None, **({"base": baseline} if baseline else {})}
    runs: dict[str, list[dict]] = {k: [] for k in srcs}
    script = str(Path(__file__).resolve().parent / "rpc_layers.py")
    for _ in range(turns):
        for label, src in srcs.items():
            out = subprocess.run([sys.executable, script, "--json", "--calls", "5000", "--rounds", "5",
                                  *(["--src", src] if src else [])], capture_output=True, text=True, check=True)
            runs[label].append(json.loads(out.stdout))
    keys = LAYERS + ["server path", "syscalls alone", "bookkeeping"]
    med = {label: {k: statistics.median(r[k] for r in rs) for k in keys} for label, rs in runs.items()}
    lines = ["server path of one small call, ns per call (medians of %d turns)" % turns,
             f"{'':18s}" + "".join(f"{label:>10s}" for label in med) + ("     now/base" if baseline else "")]
    for k in keys:
        row = f"  {k:16s}" + "".join(f"{m[k]:10.0f}" for m in med.values())
        if baseline and med["base"][k] > 0:
            row += f"{med['now'][k] / med['base'][k]:12.2f}x"
        lines.append(row)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--calls", type=int, default=1000, help="calls per round trip round")
    ap.add_argument("--rounds", type=int, default=7, help="round trip rounds (median reported)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-tvm-server", action="store_true", help="skip the TVM server anchor")
    ap.add_argument("--baseline", metavar="SRC", help="also serve rpcsrv from this checkout (an older commit) "
                                                      "in the same interleaved rounds, for before/after")
    ap.add_argument("--no-transfers", action="store_true", help="round trips only")
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer breakdown (rpc_layers.py)")
    args = ap.parse_args(argv)
    try:
        print(report(run(args.size_mb, args.calls, args.repeat, not args.no_tvm_server, args.rounds,
                         args.baseline, not args.no_transfers)))
        if not args.no_layers:
            print(layers(args.baseline), flush=True)
    except RuntimeError as exc:  # a server that did not start: its own words, no traceback
        print(f"rpc_bench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
