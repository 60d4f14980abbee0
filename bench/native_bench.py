"""Native call overhead: one tiny host function called in process, through the isolated worker, and
over RPC from the real TVM client to ``rpcsrv serve --native inprocess`` and ``--native isolated``.

    python bench/native_bench.py [--calls 2000] [--repeat 5]

The function is ``add_one`` of ``tests/native/fixtures/c_target_kernels.c`` (gcc, classic packed ABI)
on 16 float32: its own work is a few nanoseconds, so every figure is overhead.  Rows (median of
``--repeat`` runs of ``--calls`` calls, microseconds per call):

  * ``in-process call``: ``NativeFunction(a, b)`` (arguments converted each call);
  * ``in-process bound``: ``fn.bind(a, b)()`` (what the graph executor and time_evaluator do);
  * ``isolated, shared arrays``: a ``WorkerFunction`` call with the arrays in the session's arena
    (only handles cross the socket; what a session's remote arrays are);
  * ``isolated, no account`` / ``isolated, with account``: the shared-arrays call without and with a
    session memory account (the budget check each request carries), interleaved, min of the runs;
  * ``isolated, copied arrays``: the same with arrays outside the arena (copied both ways);
  * ``RPC inprocess`` / ``RPC isolated`` / ``RPC isolated, unconfined``: ``lib["add_one"](a, b)`` from
    apache-tvm's client (skipped without it), the user-visible round trip (``--native-confine on``, the
    default, and ``off``), rounds interleaved in alternating order; ``...: CPU/call`` is the CPU time
    the server and its workers spent per call (schedstat), steadier than wall time on a loaded machine.

Confinement (``rpcsrv/native/confine.py``), interleaved unconfined/confined rounds, medians (``--starts``
rounds; no spare worker is refilled meanwhile):

  * ``start, unconfined`` / ``start, confined``: a worker process from spawn to ready (ms; the confined
    one preloads the executor, loader and shim before it is ready);
  * ``confine``: the ``("confine", policy)`` request (ms; all layers);
  * ``call, unconfined`` / ``call, confined``: the shared-arrays call through each (us/call), and the
    worker's own CPU time per call (``/proc/<pid>/task/*/schedstat``; what the filter and Landlock could
    add shows there, not hidden by the wait for a CPU on a loaded machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT / "tests" / "native" / "fixtures" / "c_target_kernels.c"


def _per_call(fn, calls: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def _cpu_ns(pid: int) -> int:
    """Nanoseconds process ``pid``'s threads have run on a CPU (schedstat: not its wait for one, which on
    a loaded machine dwarfs a small call)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return total


def _rpc_rows(lib_path: Path, calls: int, repeat: int) -> dict[str, float]:
    try:
        import tvm
        from tvm import rpc
    except ImportError:
        return {}
    import re

    modes = {"RPC inprocess": ["--native", "inprocess"], "RPC isolated": [],
             "RPC isolated, unconfined": ["--native-confine", "off"]}
    procs, calls_of, runs = [], {}, {name: [] for name in modes}
    try:  # every server up at once, their rounds interleaved (the machine's load falls on all alike)
        for name, flags in modes.items():
            proc = subprocess.Popen([sys.executable, "-m", "rpcsrv", "serve", "--port", "0", *flags],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
            procs.append(proc)
            port = int(re.search(r":(\d+)", proc.stdout.readline()).group(1))
            remote = rpc.connect("127.0.0.1", port)
            remote.upload(str(lib_path), "k.so")
            f = remote.load_module("k.so")["add_one"]
            dev = remote.cpu()
            a = tvm.runtime.tensor(np.ones(16, "float32"), dev)
            b = tvm.runtime.tensor(np.zeros(16, "float32"), dev)
            kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            calls_of[name] = (remote, lambda f=f, a=a, b=b: f(a, b), [proc.pid, *map(int, kids)])
        for r in range(repeat):  # the order alternates: no mode always runs right after another
            for name, (_remote, call, pids) in (list(calls_of.items())[::-1] if r % 2 else calls_of.items()):
                cpu0 = sum(_cpu_ns(p) for p in pids)
                runs[name].append(_per_call(call, calls // 4, 1))
                runs.setdefault(f"{name}: CPU/call", []).append(
                    (sum(_cpu_ns(p) for p in pids) - cpu0) / (calls // 4) / 1e3)
    finally:
        calls_of.clear()
        for proc in procs:
            proc.terminate()
            proc.wait()
    rows = {name: statistics.median(r) for name, r in runs.items() if r}
    return rows


def _budget_ab(worker, call, calls: int, repeat: int) -> dict[str, float]:
    """The per-request cost of the memory budget: the same worker and call without a session account
    and with one (a session under a server account, as ``rpcsrv serve`` makes them), interleaved
    A/B/A/B, min of ``repeat`` runs each (the budget travels with every request either way)."""
    from rpcsrv.board.accounts import MemoryAccount

    account = MemoryAccount(4 << 30, parent=MemoryAccount(8 << 30, name="server"))
    runs: dict[str, list[float]] = {"isolated, no account": [], "isolated, with account": []}
    for _ in range(repeat):
        for name, acct in (("isolated, no account", None), ("isolated, with account", account)):
            worker.account = acct
            runs[name].append(_per_call(call, calls, 1))
    worker.account = None
    return {name: min(r) for name, r in runs.items()}


def _confine_ab(lib_path: Path, calls: int, starts: int) -> dict[str, float]:
    """Worker start-up, the confine request and a call, unconfined and confined, interleaved."""
    from rpcsrv.native import confine, proxy
    from rpcsrv.native.host import NativeSession
    from rpcsrv.native.process import worker_config

    runs: dict[str, list[float]] = {}
    for _ in range(starts):
        for on in (False, True):
            label = "confined" if on else "unconfined"
            config = worker_config(confine.ConfineOptions(enabled=on))
            t0 = time.perf_counter()
            worker = proxy.Worker(None, config=config)
            runs.setdefault(f"start, {label} (ms)", []).append((time.perf_counter() - t0) * 1e3)
            worker.close()
            session = NativeSession("isolated", max_memory=1 << 30, confine=confine.ConfineOptions(enabled=on))
            try:
                session._open_arena()
                session.worker = proxy.Worker(session.arena, session._deadline, config)
                t0 = time.perf_counter()
                path = session._confine_worker(str(lib_path)) if on else str(lib_path)
                if on:
                    runs.setdefault("confine (ms)", []).append((time.perf_counter() - t0) * 1e3)
                wfn = session.worker.load(path).get_function("add_one")
                sa, sb = session.zeros(64).view(np.float32), session.zeros(64).view(np.float32)
                cpu0 = _cpu_ns(session.worker.pid)
                runs.setdefault(f"call, {label} (us)", []).append(_per_call(lambda: wfn(sa, sb), calls, 1))
                runs.setdefault(f"worker CPU/call, {label} (us)", []).append(
                    (_cpu_ns(session.worker.pid) - cpu0) / calls / 1e3)
            finally:
                session.close()
    return {name: statistics.median(r) for name, r in runs.items()}


def _worker_data() -> dict[int, tuple[int, int]]:
    """pid -> (VmData bytes, uid) of every native worker now running on this machine."""
    out = {}
    for pid in os.listdir("/proc"):
        try:
            if not pid.isdigit() or b"rpcsrv.native.worker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            out[int(pid)] = (int(status["VmData"].split()[0]) << 10, int(status["Uid"].split()[1]))
        except (OSError, KeyError, ValueError):
            continue
    return out


def headroom(command: list[str], interval: float = 0.01) -> int:
    """Run ``command`` (e.g. pytest on the native tests) and sample every worker's data segment: the most
    any worker grew beyond its size when it confined itself (its uid changed; as root) or first seen."""
    base: dict[int, int] = {}
    peak = 0
    proc = subprocess.Popen(command, cwd=ROOT)
    while proc.poll() is None:
        for pid, (data, uid) in _worker_data().items():
            if pid not in base or (uid != 0 and base.get(-pid) == 0):
                base[pid], base[-pid] = data, uid  # first sight, or the sample just after the drop
            peak = max(peak, data - base[pid])
        time.sleep(interval)
    return peak


def breakdown(lib_path: Path, calls: int, repeat: int) -> dict[str, float]:
    """Where a remote native call's time goes, part by part (us per call, median of ``repeat``): the
    thread hop of a blocking call (``trio.to_thread``), the argument conversion and call in process, the
    worker round trip (empty request, and the call), the pickling of a call request and answer, and the
    worker's own handling of the call (its ``WorkerState.handle`` run here)."""
    import pickle

    import trio

    from rpcsrv.native import load_native_module
    from rpcsrv.native.host import NativeSession
    from rpcsrv.native.shm import Arena
    from rpcsrv.native.wire import Shared
    from rpcsrv.native.worker import WorkerState

    rows: dict[str, float] = {}

    async def hops() -> None:
        limiter = trio.CapacityLimiter(4)
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(calls):
                await trio.to_thread.run_sync(lambda: None, limiter=limiter)
            rows.setdefault("thread hop", []).append((time.perf_counter() - t0) / calls * 1e6)

    trio.run(hops)
    arena = Arena(1 << 20)
    state = WorkerState(arena, None)
    ref = state.to_wire(load_native_module(str(lib_path)))
    fn = state.handle(("get", ref, "add_one", True))[0]
    a, b = arena.zeros(64).view(np.float32), arena.zeros(64).view(np.float32)
    args = [Shared("session", arena.offset_of(x), "<f4", (16,), (4,)) for x in (a, b)]
    req = (None, ("call", fn, args))
    answer = ("ok", None, [], 0)
    rows["pickle request+answer"] = [_per_call(lambda: pickle.loads(pickle.dumps(req, 5)) and pickle.loads(
        pickle.dumps(answer, 5)), calls, 1) for _ in range(repeat)]
    rows["worker handling (here)"] = [_per_call(lambda: state.handle(req[1]), calls, 1) for _ in range(repeat)]
    session = NativeSession("isolated")
    try:
        wfn = session.load(str(lib_path)).get_function("add_one")
        sa, sb = session.zeros(64).view(np.float32), session.zeros(64).view(np.float32)
        worker = session.worker
        rows["worker round trip, empty"] = [_per_call(lambda: worker.request(("stats",), "stats"), calls, 1)
                                            for _ in range(repeat)]
        rows["worker round trip, call"] = [_per_call(lambda: wfn(sa, sb), calls, 1) for _ in range(repeat)]
    finally:
        session.close()
        arena.close()
    return {f"breakdown: {name}": statistics.median(v) for name, v in rows.items()}


def run(calls: int = 2000, repeat: int = 5, starts: int = 5) -> dict[str, float]:
    from rpcsrv.native import load_native_module
    from rpcsrv.native.host import NativeSession

    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "k.so"
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib_path), str(FIXTURE)], check=True)
        # the RPC rows first: they load TVM's libraries into this process, which must happen before the
        # shim's (its TVMFFI* names would otherwise stand in for libtvm_ffi's own)
        rpc_rows = _rpc_rows(lib_path, calls, repeat)
        fn = load_native_module(str(lib_path)).get_function("add_one")
        a, b = np.ones(16, np.float32), np.zeros(16, np.float32)
        rows = {"in-process call": _per_call(lambda: fn(a, b), calls, repeat)}
        bound = fn.bind(a, b)
        rows["in-process bound"] = _per_call(bound, calls, repeat)
        session = NativeSession("isolated")
        try:
            wfn = session.load(str(lib_path)).get_function("add_one")
            sa, sb = session.zeros(64).view(np.float32), session.zeros(64).view(np.float32)
            sa[:] = 1
            rows["isolated, shared arrays"] = _per_call(lambda: wfn(sa, sb), calls, repeat)
            assert sb[0] == 2
            rows.update(_budget_ab(session.worker, lambda: wfn(sa, sb), calls, repeat))
            rows["isolated, copied arrays"] = _per_call(lambda: wfn(a, b), calls, repeat)
            assert b[0] == 2
        finally:
            session.close()
        rows.update(rpc_rows)
        rows.update(_confine_ab(lib_path, calls, starts))
    return rows


def report(rows: dict[str, float]) -> str:
    lines = [f"{name:<26} {v:8.2f}" + ("" if "(m" in name or "(u" in name else " us/call") for name, v in rows.items()]
    base = rows["in-process call"]
    lines.append(f"isolated (shared) / in-process call: {rows['isolated, shared arrays'] / base:.1f}x")
    if "RPC isolated" in rows:
        lines.append(f"RPC isolated / RPC inprocess: {rows['RPC isolated'] / rows['RPC inprocess']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--starts", type=int, default=5, help="unconfined/confined rounds (worker starts)")
    p.add_argument("--breakdown", action="store_true", help="instead: where a remote native call's time goes")
    p.add_argument("--headroom", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="instead: run COMMAND and report the largest growth of a native worker's data")
    args = p.parse_args()
    if args.breakdown:
        with tempfile.TemporaryDirectory() as tmp:
            lib_path = Path(tmp) / "k.so"
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib_path), str(FIXTURE)], check=True)
            rows = breakdown(lib_path, args.calls, args.repeat)
            from rpcsrv.native import load_native_module

            f = load_native_module(str(lib_path)).get_function("add_one")
            x, y = np.ones(16, np.float32), np.zeros(16, np.float32)
            rows["breakdown: native call in process"] = _per_call(lambda: f(x, y), args.calls, args.repeat)
        print("\n".join(f"{name:<45} {us:8.2f} us/call" for name, us in rows.items()))
        return
    if args.headroom:
        from rpcsrv.native.confine import HEADROOM

        print(f"largest worker data growth: {headroom(args.headroom) / 2 ** 20:.1f} MiB "
              f"(confine.HEADROOM is {HEADROOM >> 20} MiB)")
        return
    print(report(run(args.calls, args.repeat, args.starts)))


if __name__ == "__main__":
    main()
