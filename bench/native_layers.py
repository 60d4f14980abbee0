"""The layers of one remote native kernel call, timed apart (``native_call_bench.py --layers``).

    python bench/native_layers.py [--n 2000]

``add_one`` on 16 float32 (gcc, ``tests/native/fixtures/c_target_kernels.c``: the same shape as
TVM's).  Each layer is timed alone in this process (median of 5 runs of ``--n``), in the shape it had
before issue 26's changes and in the shape it has now, so the table says where a call's time went and
what is left:

* thread hop: ``trio.to_thread.run_sync`` of nothing (a session ran every native call in a thread);
* arguments to the wire: the proxy's ``to_wire`` of two arrays in the session arena;
* request encode / decode: pickle of the old records (before) and the binary call frame
  (``rpcsrv.native.wire``; decoding a call seen before reads its head and keys on the argument bytes);
* worker: the arena views and the DLTensor conversion of each call (before), the cached bound call (now);
* answer encode + decode: pickle and the binary result frame;
* process round trip: one small message to another process and back over a socket pair (the worker's
  two wake-ups, with no work: the floor of any call that crosses two processes);
* whole worker call: ``WorkerFunction(a, b)`` from a thread, all of the above;
* loan round trips: since issue 26's loans, a repeated call is answered by the worker straight from
  the client's socket (``rpcsrv.native.replay``): a request from another process, the match, the bound
  native call and the answer, with the loop in Python and in C (to compare with the bare process round
  trip above).
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT / "tests" / "native" / "fixtures" / "c_target_kernels.c"


@dataclass(frozen=True)
class OldShared:
    """``wire.Shared`` as it was before (a frozen dataclass), for the ``before`` pickle rows."""

    region: str
    offset: int
    dtype: str
    shape: tuple
    strides: tuple


def _per_call(fn, n: int, repeat: int = 5) -> float:
    fn()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def _thread_hop(n: int) -> float:
    import trio

    async def main() -> float:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n // 4):
                await trio.to_thread.run_sync(int)
            runs.append((time.perf_counter() - t0) / (n // 4) * 1e6)
        return statistics.median(runs)
    return trio.run(main)


def _process_round_trip(n: int) -> float:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echo: a worker that does nothing
        ours.close()
        while True:
            data = theirs.recv(64)
            if not data:
                os._exit(0)
            theirs.sendall(data)
    theirs.close()
    try:
        return _per_call(lambda: (ours.sendall(b"x" * 40), ours.recv(64)), n)
    finally:
        ours.close()
        os.waitpid(pid, 0)


def _loan_round_trip(fn, args: tuple, n: int, use_c: bool) -> float:
    """One repeated call answered by a loan's loop (``replay.hold``, in C or Python) in another process:
    the client's request, the match, the bound native call, the answer."""
    import mmap

    from rpcsrv.native import replay
    from rpcsrv.native.wire import Shared, decode_head, encode_call

    body = b"\x04\x00\x00\x00" + b"r" * 60  # a request's bytes (any: the loop compares them whole)
    packet, answer = len(body).to_bytes(8, "little") + body, b"a" * 40
    frame = encode_call(1, None, [Shared("session", 0, "<f4", (16,), (4,))])

    class State:
        def __init__(self):
            _budget, oid, _nargs, at = decode_head(bytearray(frame))
            self.bound = {(oid, bytes(frame[at:])): fn.bind(*args, hold=True, returns=True)}

        def to_wire(self, v):
            return v

    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.environ["RPCSRV_LOAN_LOOP"] = "c" if use_c else "python"  # (this forked child's setting)
        replay.hold(State(), theirs, mmap.mmap(-1, replay.PAGE_SIZE), [(packet, "call", 1, frame, answer)], {1: 1})
        os._exit(0)
    theirs.close()
    try:
        return _per_call(lambda: (ours.sendall(packet), ours.recv(64)), n)
    finally:
        ours.close()
        os.waitpid(pid, 0)


def layers(n: int = 2000) -> dict[str, tuple[float, float]]:
    """layer -> (us before, us now); one value for both where the layer did not change."""
    from rpcsrv.native import wire
    from rpcsrv.native.host import NativeSession
    from rpcsrv.native.runtime import load_native_module

    rows: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "kernels.so"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib_path), str(FIXTURE)], check=True)
        hop = _thread_hop(n)
        rows["thread hop (to_thread)"] = (hop, 0.0)
        ns = NativeSession("isolated")
        ns.isolate_all = True
        try:
            remote = ns.load(str(lib_path))
            a, b = (ns.zeros(64).view("float32") for _ in range(2))
            wf = remote.find_function("add_one")
            worker = wf.worker
            rows["function lookup (lib[name])"] = (
                _per_call(lambda: worker.request(("get", wire.Ref("mod", remote.oid, ""), "add_one", False), "get"),
                          n // 4),
                _per_call(lambda: remote.find_function("add_one", False), n))
            to_wire = _per_call(lambda: [worker.values.encode(x, []) for x in (a, b)], n)
            rows["arguments to the wire (2 arrays)"] = (to_wire, to_wire)
            args = [worker.values.encode(x, []) for x in (a, b)]
            budget = (0, (("session", 0, 1 << 30), ("server", 0, 4 << 30)))
            old = (budget, ("call", wf.oid, [OldShared(*x) for x in args]))  # the records as they were pickled
            frame = wire.encode_call(wf.oid, budget, args)
            data = pickle.dumps(old, protocol=pickle.HIGHEST_PROTOCOL)
            rows["request encode"] = (_per_call(lambda: pickle.dumps(old, protocol=5), n),
                                      _per_call(lambda: wire.encode_call(wf.oid, budget, args), n))

            def head_and_key() -> None:  # what a worker reads of a call it has seen before
                _budget, oid, _nargs, at = wire.decode_head(frame)
                return (oid, bytes(frame[at:]))
            rows["request decode"] = (_per_call(lambda: pickle.loads(data), n), _per_call(head_and_key, n))
            here = load_native_module(str(lib_path)).find_function("add_one")
            arena = ns.arena

            def before() -> None:
                views = [arena.view(s.offset, s.dtype, s.shape, s.strides) for s in args]
                here.bind(*views)()  # the conversion every call paid

            bound: dict = {}

            def now() -> None:
                key = (wf.oid, *((type(s), s) for s in args))
                call = bound.get(key)
                if call is None:
                    call = bound[key] = here.bind(*[arena.view(s.offset, s.dtype, s.shape, s.strides)
                                                    for s in args], hold=False, returns=True)
                call()
            rows["worker: views, conversion, call"] = (_per_call(before, n), _per_call(now, n))
            answer = ("ok", None, [], 0)
            rows["answer encode + decode"] = (
                _per_call(lambda: pickle.loads(pickle.dumps(answer, protocol=5)), n),
                _per_call(lambda: wire.decode_result(wire.encode_result(answer)), n))
            trip = _process_round_trip(n)
            rows["process round trip (2 wake-ups)"] = (trip, trip)
            rows["whole worker call (sync)"] = (float("nan"), _per_call(lambda: wf(a, b), n))
            # a repeated call since the loan (docs/native.md, "Repeated calls"): no server in between
            local = tuple(np.zeros(16, "float32") for _ in range(2))
            rows["loan, Python loop (round trip)"] = (float("nan"), _loan_round_trip(here, local, n, False))
            rows["loan, C loop (round trip)"] = (float("nan"), _loan_round_trip(here, local, n, True))
        finally:
            ns.close()
    return rows


def report_layers(rows: dict[str, tuple[float, float]]) -> str:
    lines = ["layers of one native call, us (each timed alone in this process):",
             f"  {'layer':36s} {'before':>9s} {'now':>9s}"]
    for name, (before, now) in rows.items():
        lines.append(f"  {name:36s} {before:9.1f} {now:9.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args(argv)
    print(report_layers(layers(args.n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
