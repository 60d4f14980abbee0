"""The hardware-in-the-loop runner: the vendor's host side of a board farm.

Compiles the two demo models (``rpcsrv.client.demo_models``: the BYOC guide's add/sub/mul graph and a small
CNN) into raw-blob libraries with rpcsrv's client (no C compiler needed), computes reference outputs
with onnxruntime, then asks the TVM tracker for boards with the *real* TVM client
(``tvm.rpc.connect_tracker(host, port).request(key)``) and runs the models there, alternating, the
way TVM's graph executor API is used (``lib["default"](dev)``, ``set_input``, ``run``, ``get_output``).

A farm of several machines names each key with ``--board KEY=MACHINE[:COUNT]`` (e.g.
``--board board-arm64=arm64``): that key's boards also get native libraries cross-compiled for the
machine (``hil_cases.py``: TVM kernels, a partially offloaded BYOC ``.so``, a Relax VM executable),
each case run ``--rounds`` times.

Every output is compared with onnxruntime or numpy; the exit status is non-zero on any mismatch or
failure, or when fewer boards than asked served a key.  A board is told apart by the workspace path its
``tvm.rpc.server.workpath`` returns (give each board its own ``--workdir``).

    python deploy/hil_runner.py --tracker 127.0.0.1:9190 --key board-x --requests 20 --boards 2
    python deploy/hil_runner.py --tracker tracker:9190 --board board-amd64=amd64:2 --board board-arm64=arm64

Used by ``docker/compose.yml`` (the runner service) and by ``tests/hil`` and ``tests/deploy``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Case:
    name: str
    library: Path
    inputs: dict
    expected: list
    kind: str = "graph"  # graph: a graph executor library; kernel: a function; vm: a Relax VM executable
    entry: str = "default"


@dataclass
class Tally:
    ok: int = 0
    failed: list = field(default_factory=list)
    boards: dict = field(default_factory=dict)  # board (workdir) -> requests served
    seconds: dict = field(default_factory=dict)  # case -> the fastest run, upload and load excluded

    def as_dict(self) -> dict:
        return {"ok": self.ok, "failed": self.failed, "boards": self.boards,
                "seconds": {k: round(v, 4) for k, v in self.seconds.items()}}


def build_cases(out_dir: Path) -> list[Case]:
    """The demo models as raw-blob libraries, with inputs and onnxruntime's outputs."""
    from rpcsrv.client.compiler import compile_onnx
    from rpcsrv.client.demo_models import onnxruntime_outputs, sample_inputs, seed_model, small_cnn

    cases = []
    for name, model, ops in [("byoc_seed", seed_model(), ["add", "sub", "mul"]), ("small_cnn", small_cnn(), None)]:
        lib = out_dir / f"{name}.blob"
        compile_onnx(model, ops=ops).export_library(str(lib), fmt="blob")
        inputs = sample_inputs(model)
        cases.append(Case(name, lib, inputs, onnxruntime_outputs(model, inputs)))
    return cases


def board_of(sess) -> str:
    """Which board a session landed on: the parent of its workspace."""
    return str(Path(sess.get_function("tvm.rpc.server.workpath")("x")).parent.parent)


def _check(case: Case, i: int, got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        raise AssertionError(f"{case.name} output {i}: shape {got.shape}, expected {want.shape}")
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        raise AssertionError(f"{case.name} output {i}: max error {np.max(np.abs(got - want)):.3g}")
    return float(np.max(np.abs(got - want)))


def run_case(tvm, sess, case: Case, times: dict | None = None) -> float:
    """Upload, load and run ``case`` in ``sess``; the largest |error| against the reference (raises on
    a wrong value, shape or count).  ``times[case.name]``: the fastest run in seconds."""
    sess.upload(str(case.library))
    lib = sess.load_module(case.library.name)
    dev = sess.cpu(0)
    args = [tvm.runtime.tensor(v, dev) for v in case.inputs.values()]
    start = time.perf_counter()
    if case.kind == "kernel":  # destination-passing: the outputs are the last arguments
        outs = [tvm.runtime.empty(w.shape, str(w.dtype), dev) for w in case.expected]
        lib[case.entry](*args, *outs)
        got = [o.numpy() for o in outs]
    elif case.kind == "vm":
        from tvm import relax

        out = relax.VirtualMachine(lib, dev)[case.entry](*args)
        got = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    else:
        gmod = lib["default"](dev)
        set_input, run, get_output = gmod["set_input"], gmod["run"], gmod["get_output"]
        for name, value in zip(case.inputs, args):
            set_input(name, value)
        run()
        got = [get_output(i).numpy() for i in range(len(case.expected))]
    elapsed = time.perf_counter() - start
    if times is not None:
        times[case.name] = min(elapsed, times.get(case.name, elapsed))
    if len(got) != len(case.expected):
        raise AssertionError(f"{case.name}: {len(got)} outputs, expected {len(case.expected)}")
    return max((_check(case, i, g, w) for i, (g, w) in enumerate(zip(got, case.expected))), default=0.0)


def request_and_run(tvm, host: str, port: int, key: str, case: Case, tally: Tally, timeout: float = 60.0,
                    session_timeout: float = 60.0) -> None:
    """One request through the tracker; retried while the tracker is away (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            tracker = tvm.rpc.connect_tracker(host, port)
            sess = tracker.request(key, session_timeout=session_timeout, max_retry=2)
            break
        except (RuntimeError, OSError, ConnectionError) as exc:  # the tracker is restarting
            if time.monotonic() > deadline:
                raise RuntimeError(f"no board for {key!r} within {timeout}s: {exc}") from None
            time.sleep(0.5)
    board = board_of(sess)
    run_case(tvm, sess, case, tally.seconds)
    tally.ok += 1
    tally.boards[board] = tally.boards.get(board, 0) + 1


def wait_for_boards(tvm, host: str, port: int, key: str, count: int, timeout: float) -> list:
    """Poll ``tracker.summary()`` until ``count`` boards are listed under ``key``; their entries."""
    deadline = time.monotonic() + timeout
    listed: list = []
    while time.monotonic() < deadline:
        try:
            info = tvm.rpc.connect_tracker(host, port).summary()
            listed = [s for s in info["server_info"] if s.get("key") == "server:" + key]
            if len(listed) >= count:
                return listed
        except (RuntimeError, OSError, ConnectionError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{len(listed)} of {count} boards registered under {key!r} after {timeout}s")


def parse_board(spec: str) -> tuple[str, str, int]:
    """``KEY=MACHINE[:COUNT]`` -> (key, machine, count)."""
    key, _, rest = spec.partition("=")
    machine, _, count = rest.partition(":")
    if not key or machine not in ("amd64", "arm64", "armv7"):
        raise argparse.ArgumentTypeError(f"--board {spec!r}: expected KEY=amd64|arm64|armv7[:COUNT]")
    return key, machine, int(count or 1)


def serve_key(tvm, host: str, port: int, key: str, cases: list, requests: int, session_timeout: float) -> Tally:
    """``requests`` requests for ``key``, going round ``cases``."""
    tally = Tally()
    for i in range(requests):
        case = cases[i % len(cases)]
        try:
            request_and_run(tvm, host, port, key, case, tally, session_timeout=session_timeout)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
            tally.failed.append(f"request {i} ({case.name}): {type(exc).__name__}: {exc}")
    return tally


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracker", required=True, metavar="HOST:PORT")
    p.add_argument("--key", help="a key whose boards run the demo models (--requests of them)")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--boards", type=int, default=2, help="distinct boards that must serve --key")
    p.add_argument("--board", action="append", default=[], type=parse_board, metavar="KEY=MACHINE[:COUNT]",
                   help="a key whose COUNT (1) boards are MACHINE (amd64, arm64, armv7): they run the demo "
                        "models and native libraries cross-compiled for MACHINE")
    p.add_argument("--rounds", type=int, default=1, help="runs of each case per --board key")
    p.add_argument("--session-timeout", type=float, default=120.0, help="seconds (emulated boards are slow)")
    p.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the boards to register")
    p.add_argument("--prometheus", metavar="URL", help="a Prometheus scraping the boards (targets labelled with "
                                                          "their key): check that their counters moved")
    args = p.parse_args(argv)
    if not args.key and not args.board:
        p.error("give --key or --board")
    import tvm

    from hil_cases import machine_cases
    from hil_metrics import check, expectations

    host, _, port = args.tracker.rpartition(":")
    farm = [(args.key, None, args.boards)] if args.key else []
    farm += args.board
    good, expected, boards = True, {}, {}
    with tempfile.TemporaryDirectory(prefix="hil-") as tmp:
        demo = build_cases(Path(tmp))
        plan = [(key, machine, count, demo + machine_cases(Path(tmp), machine, Case) if machine else demo)
                for key, machine, count in farm]
        for key, _, count, _ in plan:
            listed = wait_for_boards(tvm, host, int(port), key, count, args.wait)
            print(f"runner: {key}: {len(listed)} boards registered: {[s['addr'] for s in listed]}", flush=True)
        for key, machine, count, cases in plan:
            requests = args.rounds * len(cases) if machine else args.requests
            tally = serve_key(tvm, host, int(port), key, cases, requests, args.session_timeout)
            print(f"runner: {key}:" if machine else "runner:", json.dumps(tally.as_dict()), flush=True)
            good &= not tally.failed and tally.ok == requests and len(tally.boards) >= count
            expected[key], boards[key] = expectations(cases, requests), count
    if args.prometheus:
        failures = check(args.prometheus.rstrip("/"), expected, boards)
        print("runner: prometheus:", json.dumps(failures or "every board's counters moved"), flush=True)
        good &= not failures
    print("runner:", "PASS" if good else "FAIL", flush=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # rpcsrv from a checkout
    sys.exit(main())
