"""Remote native kernel call: rpcsrv (isolated worker, in process) against TVM's own RPC server.

    python bench/native_call_bench.py [--calls 300] [--rounds 7]

``add_one`` on 16 float32, compiled by apache-tvm (``tvm.compile`` of a TE prim func, target llvm) and
exported as a shared library, is uploaded and loaded on three servers driven by the same real TVM
client: ``python -m tvm.exec.rpc_server`` (the anchor), ``rpcsrv serve --native isolated`` (the default)
and ``rpcsrv serve --native inprocess``.  Call shapes in microseconds per call (the median over every
call of ``--rounds`` rounds of ``--calls`` calls, the servers taking turns round by round), in the two
CPU placements of ``rpc_bench``: client and servers (their native workers too) pinned to one CPU (the
processing cost) and to two different CPUs (a wake-up crosses CPUs on every call, as between two
machines); left to the scheduler a figure swings between the two from run to run:

* ``lib["add_one"](a, b)``: the function looked up on every call (a lookup, the call, and the
  client freeing the function handle: three requests);
* ``f(a, b)``: the function looked up once (one request per call).

A third row, the small call ``tvm.rpc.server.workpath("x")``, is the floor: one request with no native
code.  ``--baseline DIR`` adds the two rpcsrv modes run from another checkout (before/after in one run);
``--layers`` times the layers of one call apart (``native_layers.py``).  Besides wall time per call:
the CPU time the server's processes (its native worker included) spent per call (``(server CPU)``
rows), since on a loaded machine the wall time mostly measures waiting for a core (rpcsrv polls for the
client's next request for up to 300 us after an answer, so on 2 CPUs its CPU time per call is about
the round trip: it counts the wait, which TVM's server spends asleep).  Prints each
figure and its ratio to TVM's server (the goal: <= 1x, isolated included).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rpc_bench import free_port, pin, start, stop  # noqa: E402

#: rpcsrv's start-up line (its log lines, with their clock times, come through the same pipe)
SERVING = r"serving on [\d.]+:(\d+)"

N = 16
_BUILD = """
import sys, tvm
from tvm import te
a = te.placeholder((%d,), name="A", dtype="float32")
b = te.compute(a.shape, lambda i: a[i] + 1.0, name="B")
func = te.create_prim_func([a, b]).with_attr("global_symbol", "add_one")
tvm.compile(func, target={"kind": "llvm"}).export_library(sys.argv[1])
""" % N


def group_cpu(pgid: int) -> float:
    """Seconds of CPU time the live threads of process group ``pgid`` have run (``/proc/.../schedstat``,
    nanoseconds): a server's processing cost, which the machine's load does not inflate as it does
    wall time (threads that ended are not counted: trio keeps its idle threads for seconds)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            for task in os.listdir(f"/proc/{entry}/task"):
                with open(f"/proc/{entry}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def build(out: Path) -> Path:
    """``add_one`` compiled by apache-tvm in a child process (this one only holds the client)."""
    subprocess.run([sys.executable, "-c", _BUILD, str(out)], check=True, capture_output=True, timeout=600)
    return out


def servers(baseline: str | None = None) -> dict[str, tuple[list[str], str]]:
    """The servers: TVM's, rpcsrv in both native modes, and (``baseline``: another checkout of rpcsrv, run
    from its own folder) the same two modes of that checkout, for before/after figures in one run."""
    p0 = free_port()
    rpcsrv = [sys.executable, "-m", "rpcsrv", "serve", "--port", "0", "--native"]
    found = {"TVM server": ([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(p0),
                             "--port-end", str(p0 + 50)], r"bind to [\d.]+:(\d+)"),
             "rpcsrv isolated": (rpcsrv + ["isolated"], SERVING),
             "rpcsrv inprocess": (rpcsrv + ["inprocess"], SERVING)}
    if baseline:
        for mode in ("isolated", "inprocess"):
            found[f"before {mode}"] = (["env", "-C", baseline, f"PYTHONPATH={baseline}", *rpcsrv, mode], SERVING)
    return found


def run(calls: int, rounds: int, which: list[str] | None = None,
        baseline: str | None = None) -> dict[str, dict[str, float]]:
    import tvm
    from tvm import rpc

    procs, sessions = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = build(Path(tmp) / "add_one.so")
        try:
            for name, (cmd, pattern) in servers(baseline).items():
                if which and name not in which:
                    continue
                proc, port = start(cmd, pattern)
                procs.append(proc)
                time.sleep(0.3 if name == "TVM server" else 0)
                remote = rpc.connect("127.0.0.1", port)
                remote.upload(str(lib_path))
                lib = remote.load_module("add_one.so")
                dev = remote.cpu(0)
                x = np.arange(N, dtype="float32")
                a, b = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(np.zeros(N, "float32"), dev)
                lib["add_one"](a, b)
                np.testing.assert_allclose(b.numpy(), x + 1)  # the kernel really ran, on every server
                sessions[name] = (remote, lib, a, b, proc.pid)
            shapes = {'lib["add_one"](a, b)': lambda r, lib, a, b: (lambda: lib["add_one"](a, b)),
                      "f(a, b)": lambda r, lib, a, b: (lambda f=lib["add_one"]: f(a, b)),
                      'lib["add_one"] alone': lambda r, lib, a, b: (lambda: lib["add_one"]),
                      "small call workpath": lambda r, lib, a, b: (
                          lambda f=r.get_function("tvm.rpc.server.workpath"): f("x"))}
            results: dict[str, dict[str, float]] = {}
            everywhere = os.sched_getaffinity(0)
            cpu = min(everywhere)
            other = min(everywhere - {cpu}, default=cpu)
            pgids = [pgid for *_, pgid in sessions.values()]
            for label, server_cpus in (("1 CPU", {cpu}), ("2 CPUs", {other})):
                pin(pgids, server_cpus, {cpu})
                results.update(_rounds(sessions, shapes, calls, rounds, label))
            pin(pgids, everywhere, everywhere)
            return results
        finally:
            sessions.clear()
            stop(procs)


def _rounds(sessions: dict, shapes: dict, calls: int, rounds: int, label: str) -> dict[str, dict[str, float]]:
    """Microseconds per call of each shape on each server, the servers taking turns round by round: the
    median over every call (as ``rpc_bench``: the calls another process preempted do not count), and
    the servers' CPU time per call over the whole round."""
    clock = time.perf_counter_ns
    per_call = {(s, n): [] for s in shapes for n in sessions}
    cpu = {(s, n): [] for s in shapes for n in sessions}
    for _ in range(rounds):
        for shape, make in shapes.items():
            for name, (remote, lib, a, b, pgid) in sessions.items():
                call = make(remote, lib, a, b)
                call()
                times = per_call[shape, name]
                c0 = group_cpu(pgid)
                for _ in range(calls):
                    t = clock()
                    call()
                    times.append(clock() - t)
                cpu[shape, name].append((group_cpu(pgid) - c0) / calls * 1e6)
    out = {f"{shape}, {label}": {name: float(np.median(per_call[shape, name])) / 1e3 for name in sessions}
           for shape in shapes}
    out.update({f"{shape}, {label} (server CPU)": {name: float(np.median(cpu[shape, name])) for name in sessions}
                for shape in shapes})
    return out


def report(results: dict[str, dict[str, float]]) -> str:
    lines = [f"native kernel call (add_one, {N} float32), us per call, median of rounds:"]
    for shape, row in results.items():
        anchor = row.get("TVM server")
        for name, us in row.items():
            ratio = f"  {us / anchor:5.2f}x TVM's" if anchor and name != "TVM server" else ""
            lines.append(f"  {shape:44s} {name:18s} {us:8.1f}{ratio}")
    lines.append("goal: rpcsrv isolated <= 1x TVM's server")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", action="append", help="run only this server (repeatable)")
    ap.add_argument("--baseline", help="another rpcsrv checkout to compare with (before/after in one run)")
    ap.add_argument("--layers", action="store_true", help="also time the layers of a call (native_layers.py)")
    args = ap.parse_args(argv)
    try:
        print(report(run(args.calls, args.rounds, args.only, args.baseline)))
        if args.layers:
            from native_layers import layers, report_layers

            print(report_layers(layers()))
    except RuntimeError as exc:
        print(f"native_call_bench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
